"""Save and resume a calibration: observer states after each batch, restored after a crash.

Why: a long calibration can be killed (pre-emption, a closed notebook); observer states are small
mergeable tensors, so they are saved after every batch and a new process continues with the
same data in the same order, giving the record of an uninterrupted run. Safe to load: a flat
``dict[str, Tensor]`` read with ``torch.load(weights_only=True)``; its metadata (layers, observer
kinds, digests of the weights, model, config, settings and data) must match the session being
resumed, else a ``CalibrationError`` names the file. Writes are atomic."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

import torch

from amct_torch.errors import CalibrationError
from amct_torch.inputs.limits import check_checkpoint_path, check_regular_file

FORMAT = "amct_torch.calibration.checkpoint/1"


def model_digest(model: Any) -> str:
    """SHA-256 of a model's parameters and buffers (names, dtypes, shapes, values): the same
    prototxt with other weights gives another digest."""
    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        arr = t.detach().cpu().contiguous()
        h.update(f"{name}|{arr.dtype}|{tuple(arr.shape)}|".encode())
        h.update(arr.reshape(-1).view(torch.uint8).numpy().tobytes() if arr.numel() else b"")
    return h.hexdigest()


def set_run_fingerprint(session: Any, **settings: Any) -> None:
    """Attach what else a resumed run must share with the saved one: the model file's text,
    the resolved quant config, the calibration settings and the data's description (any
    JSON-able values). ``quantize`` calls it; a checkpoint saved with other settings is then
    refused on resume."""
    session.amct_run_fingerprint = hashlib.sha256(
        json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def describe_data(data: Any) -> Any:
    """What identifies calibration data cheaply: names, sizes and mtimes of a file or a
    folder's files; shape and dtype of an array; None for an iterable."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
        out = []
        for n in names:
            p = os.path.join(path, n) if n else path
            try:
                st = os.stat(p)
            except OSError:
                continue
            out.append([n or os.path.basename(path), st.st_size, st.st_mtime_ns])
        return out
    if hasattr(data, "shape") and hasattr(data, "dtype"):
        return [list(data.shape), str(data.dtype)]
    return None


def _fingerprint(session: Any) -> dict:
    from amct_torch.calibration.observer_plan import act_key
    digest = getattr(session, "amct_model_digest", None)
    if digest is None:  # computed once per session: the weights do not change while calibrating
        digest = model_digest(session.model)
        session.amct_model_digest = digest
    return {"format": FORMAT,
            "groups": [[list(g.layers), [str(v) for v in act_key(g.config)], bool(g.joint)]
                       for g in session.groups],
            "observers": [type(o).__name__ for o in session.observers],
            "weights": digest,
            "run": getattr(session, "amct_run_fingerprint", None)}


def _encode(meta: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(meta, sort_keys=True).encode()), dtype=torch.uint8)


def _decode(t: torch.Tensor, path: str) -> dict:
    try:
        return json.loads(bytes(t.cpu().tolist()).decode())
    except (ValueError, UnicodeDecodeError):
        raise CalibrationError("calibration checkpoint metadata is unreadable", file=path) from None


def checkpoint_state(session: Any) -> dict[str, torch.Tensor]:
    """The flat tensor dict of a running session: metadata, batches seen, group input shapes,
    and every observer's ``state_dict`` under ``g{index}/{key}``."""
    if session.done:
        raise CalibrationError("the calibration has already finished: nothing to checkpoint")
    out = {"meta": _encode(_fingerprint(session)),
           "batches_seen": torch.tensor(int(session.batches_seen), dtype=torch.int64),
           "shapes": torch.tensor([list(g.shape) if g.shape is not None else [-1, -1, -1]
                                   for g in session.groups], dtype=torch.int64).reshape(-1, 3)}
    for i, obs in enumerate(session.observers):
        for k, v in obs.state_dict().items():
            out[f"g{i}/{k}"] = v.detach()
    return out


def save_checkpoint(session: Any, path: str) -> None:
    """Write ``checkpoint_state(session)`` to ``path`` atomically."""
    state = checkpoint_state(session)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException as err:  # a SIGTERM mid-save (Terminated) leaves no temporary file
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not isinstance(err, OSError):
            raise
        raise CalibrationError(f"cannot write the calibration checkpoint: {err.strerror or err}",
                               file=path) from None


def load_checkpoint(session: Any, path: str, device: Optional[torch.device] = None,
                    batch_total: Optional[int] = None) -> int:
    """Restore the observers, input shapes and batch count of ``session`` from ``path``;
    returns the number of batches already calibrated (skip that many of your data).

    ``device``: where observer states go (default: the device of the session's model);
    ``batch_total``: batches this process calibrates (bounds the saved count). Anything that
    does not belong to this run — another model, other weights, config, settings or data, a
    count out of range, unknown keys, a state of the wrong shape — is a ``CalibrationError``
    naming the checkpoint file."""
    if session.done:
        raise CalibrationError("the calibration has already finished: cannot resume it", file=path)
    dev = device or next((t.device for t in [*session.model.parameters(), *session.model.buffers()]),
                         torch.device("cpu"))
    check_regular_file(path, "calibration checkpoint", CalibrationError)  # a FIFO would block
    try:
        state = torch.load(path, map_location=dev, weights_only=True)
    except FileNotFoundError:
        raise CalibrationError("calibration checkpoint not found", file=path) from None
    except Exception as err:  # noqa: BLE001 - a corrupt or foreign file, whatever the exception
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CalibrationError(f"not a readable calibration checkpoint: {msg}", file=path) from None
    if not isinstance(state, dict) or "meta" not in state or not all(
            isinstance(v, torch.Tensor) for v in state.values()):
        raise CalibrationError("not a calibration checkpoint (expected a dict of tensors)", file=path)
    meta = _decode(state["meta"], path)
    want = _fingerprint(session)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CalibrationError("not a calibration checkpoint of this version", file=path)
    for key, what in (("groups", "the layers or algorithms"), ("observers", "the observers"),
                      ("weights", "the weights (same layers, other values)"),
                      ("run", "the model file, quant config, calibration settings or data")):
        if key == "run" and meta.get(key) is None:
            continue  # saved by the five-call workflow, which knows no run settings
        if meta.get(key) != want[key]:
            raise CalibrationError(f"the calibration checkpoint belongs to another model or quant "
                                   f"config (another run): {what} "
                                   "differ; delete it or give another --checkpoint", file=path)
    seen = _batches_seen(state, session, path, batch_total)
    shapes = _shapes(state, session, path)
    parts = _observer_parts(state, session, path)
    try:
        for obs, part in zip(session.observers, parts):
            obs.load_state_dict(part)
    except CalibrationError as err:
        raise err.with_file(path) from None
    except (KeyError, RuntimeError, ValueError, IndexError, TypeError) as err:
        raise CalibrationError(f"calibration checkpoint has an invalid observer state: {err}",
                               file=path) from None
    for group, row in zip(session.groups, shapes):
        group.shape = tuple(row) if row[0] >= 0 else None
    session.batches_seen = seen
    return seen


_BASE_KEYS = ("meta", "batches_seen", "shapes")


def _batches_seen(state: dict, session: Any, path: str, batch_total: Optional[int]) -> int:
    """The saved batch count: a 0-d integer in [0, batches this run calibrates)."""
    t = state.get("batches_seen")
    if t is None or t.dim() != 0 or t.is_floating_point() or t.dtype == torch.bool:
        raise CalibrationError("calibration checkpoint: batches_seen must be one integer", file=path)
    seen = int(t)
    limit = session.batch_num if batch_total is None else min(session.batch_num, batch_total)
    if not 0 <= seen <= limit:
        raise CalibrationError(f"calibration checkpoint: batches_seen {seen} is outside "
                               f"[0, {limit}] for this run", file=path)
    return seen


def _shapes(state: dict, session: Any, path: str) -> list[list[int]]:
    """Saved input shapes: one row (C, H, W) per group, all -1 (not seen) or all in [1, 2^31)."""
    t = state.get("shapes")
    n = len(session.groups)
    if t is None or t.is_floating_point() or tuple(t.shape) != (n, 3):
        raise CalibrationError(f"calibration checkpoint: shapes must be {n}x3 integers", file=path)
    rows = [[int(v) for v in row] for row in t.cpu().tolist()]
    for row in rows:
        if not (row == [-1, -1, -1] or all(1 <= v < 2 ** 31 for v in row)):
            raise CalibrationError(f"calibration checkpoint: invalid input shape {row}", file=path)
    return rows


def _observer_parts(state: dict, session: Any, path: str) -> list[dict[str, torch.Tensor]]:
    """The state dicts of the observers, from keys ``g{index}/{name}``; unknown keys refused."""
    parts: list[dict[str, torch.Tensor]] = [{} for _ in session.observers]
    for k, v in state.items():
        if k in _BASE_KEYS:
            continue
        idx, sep, key = k[1:].partition("/")
        if not (k.startswith("g") and sep and idx.isdigit() and int(idx) < len(parts) and key):
            raise CalibrationError(f"calibration checkpoint has an unknown entry {k!r}", file=path)
        parts[int(idx)][key] = v
    return parts


class Checkpointer:
    """Saves a session after each batch and resumes it.

    Use ``save()`` after each forward of your own loop, or ``attach()`` to save from a forward
    hook on the session's model (registered after the session's own batch counter, so it sees
    the updated count; after the last batch it deletes the file instead). ``resume()`` loads
    the file when it exists and returns the batches already done (0 otherwise)."""

    def __init__(self, session: Any, path: str, batch_total: Optional[int] = None, every: int = 1) -> None:
        if every < 1:
            raise CalibrationError(f"checkpoint interval must be >= 1 batch, got {every}")
        self.session = session
        self.path = os.fspath(path)
        check_checkpoint_path(self.path, CalibrationError)  # before the first batch, not after it
        self.batch_total = batch_total
        self.every = int(every)
        self._handle = None
        self._since = 0

    def resume(self) -> int:
        if not os.path.exists(self.path):
            return 0
        return load_checkpoint(self.session, self.path, batch_total=self.batch_total)

    def save(self) -> None:
        """Save now if ``every`` batches passed since the last save (IFMR exact states grow
        with every batch: a larger ``every`` keeps the cost of saving down)."""
        self._since += 1
        if not self.session.done and self._since >= self.every:
            save_checkpoint(self.session, self.path)
            self._since = 0

    def remove(self) -> None:
        """Delete the checkpoint (the calibration finished) and detach the hook."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def attach(self) -> Checkpointer:
        def hook(_m: Any, _a: Any, _o: Any) -> None:
            if self.session.done:
                self.remove()
            else:
                self.save()
        self._handle = self.session.model.register_forward_hook(hook)
        return self
