"""Save and resume a calibration: observer states after each batch, restored after a crash.

Why: calibrating a large model on many batches can take long enough for a job to be killed
(pre-emption, out of memory elsewhere, a closed notebook). Observer states are small mergeable
tensors, so they are written after every batch and a new process continues where the old one
stopped; since the observers get exactly the same data in the same order, the record is the
same as an uninterrupted run.

Safe to load: the file is a ``torch.save`` of a flat ``dict[str, Tensor]`` and is read with
``torch.load(weights_only=True)`` — no pickled objects, so a tampered file cannot run code.
Metadata (layer names, observer kinds) travels as a UTF-8 JSON string in a uint8 tensor and
must match the session being resumed, else ``CalibrationError`` naming the file.
Writes are atomic (temporary file + ``os.replace``): a kill during a save leaves the previous
checkpoint intact.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from amct_torch.errors import CalibrationError

FORMAT = "amct_torch.calibration.checkpoint/1"


def _fingerprint(session: Any) -> dict:
    from amct_torch.calibration.plan import act_key
    return {"format": FORMAT,
            "groups": [[list(g.layers), [str(v) for v in act_key(g.config)], bool(g.joint)]
                       for g in session.groups],
            "observers": [type(o).__name__ for o in session.observers]}


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
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise CalibrationError(f"cannot write the calibration checkpoint: {err.strerror or err}",
                               file=path) from None


def load_checkpoint(session: Any, path: str, device: Optional[torch.device] = None) -> int:
    """Restore the observers, input shapes and batch count of ``session`` from ``path``;
    returns the number of batches already calibrated (skip that many of your data).

    ``device``: where observer states go (default: the device of the session's model)."""
    from amct_torch.calibration.workflow import device_of

    if session.done:
        raise CalibrationError("the calibration has already finished: cannot resume it", file=path)
    dev = device or device_of(session.model)
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
    if meta != want:
        raise CalibrationError("the calibration checkpoint belongs to another model or quant "
                               "config (layers or algorithms differ)", file=path)
    parts: list[dict[str, torch.Tensor]] = [{} for _ in session.observers]
    for k, v in state.items():
        if k.startswith("g") and "/" in k:
            idx, key = k[1:].split("/", 1)
            parts[int(idx)][key] = v
    try:
        for obs, part in zip(session.observers, parts):
            obs.load_state_dict(part)
    except (KeyError, RuntimeError, ValueError) as err:
        raise CalibrationError(f"calibration checkpoint has an invalid observer state: {err}",
                               file=path) from None
    for group, row in zip(session.groups, state["shapes"].cpu().tolist()):
        group.shape = tuple(int(v) for v in row) if row[0] >= 0 else None
    session.batches_seen = int(state["batches_seen"])
    return session.batches_seen


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
        self.batch_total = batch_total
        self.every = int(every)
        self._handle = None
        self._since = 0

    def resume(self) -> int:
        if not os.path.exists(self.path):
            return 0
        return load_checkpoint(self.session, self.path)

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

    def attach(self) -> "Checkpointer":
        def hook(_m: Any, _a: Any, _o: Any) -> None:
            if self.session.done:
                self.remove()
            else:
                self.save()
        self._handle = self.session.model.register_forward_hook(hook)
        return self
