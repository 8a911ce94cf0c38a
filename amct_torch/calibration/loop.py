"""The calibration loop, for one process and for one rank of many: the first ``batch_num``
batches through the model ``quantize_model`` returned, then the factors.

Why its own file: an AMCT user writes this loop themselves; ours adds a tqdm bar (silent when
stderr is not a terminal), data errors as ``DataError`` naming the batch, a clear error when the
data runs out early, and a checkpoint after every batch. Given its ``Ranks``
(``distributed.DistContext``) a process forwards its block of the batches, and the session is
kept open until the statistics of all ranks are folded."""
from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, Optional, Protocol

import torch
from torch import nn

from amct_torch.calibration.checkpoint import Checkpointer
from amct_torch.calibration.session import CalibrationSession
from amct_torch.errors import AmctError, DataError
from amct_torch.runtime.progress import progress_enabled


class Ranks(Protocol):
    """What the loop needs to know of a process in a multi-process job
    (``distributed.DistContext`` is one)."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def active(self) -> bool: ...      # more than one process

    @property
    def is_writer(self) -> bool: ...   # rank 0: shows progress

    def block(self, n_batches: int) -> tuple[int, int]: ...   # [start, stop) of this rank's batches

    def fold(self, session: CalibrationSession) -> None: ...  # all ranks' statistics, before the factors


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, tuple):
        return tuple(b.to(device) for b in batch)
    return batch.to(device)


def _shape(batch: Any) -> str:
    if isinstance(batch, tuple):
        return ", ".join(str(list(b.shape)) for b in batch)
    return str(list(batch.shape))


def forward(model: nn.Module, batch: Any, index: int) -> Any:
    """One forward of batch ``index`` (0-based; messages count batches from 1, as every
    message does); a failure that is not one of ours means the data does not fit the net."""
    try:
        with torch.no_grad():
            return model(*batch) if isinstance(batch, tuple) else model(batch)
    except AmctError:
        raise
    except (RuntimeError, ValueError, IndexError) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"the model cannot run on calibration batch {index + 1} shaped "
                        f"{_shape(batch)}: {msg}") from None


def run_calibration(model: nn.Module, session: CalibrationSession, batches: Iterable[Any],
                    device: Optional[torch.device] = None, quiet: bool = False, *,
                    ctx: Optional[Ranks] = None, checkpoint: Optional[str] = None) -> Iterator[Any]:
    """Run this process's share of the first ``session.batch_num`` batches of ``batches``
    through ``model`` on ``device``, then finish ``session`` (factors computed, ``on_finish``
    called: with ``ctx``, it should write only where ``ctx.is_writer``).

    ``ctx``: this process's place in a ``torchrun`` job (``distributed.init_distributed``);
    without it the process calibrates alone. Every rank passes the same batches. ``device``
    defaults to ``ctx.device`` (CUDA when present without a ``ctx``).
    ``checkpoint``: a path; the observer states are saved there after every batch (suffix
    ``.rankR`` per rank when distributed), a run resumes from it when it exists, and it is
    deleted once the factors are computed (see checkpoint.py).

    Returns an iterator over the batches after the first ``batch_num`` (held-out data for a
    report). Raises ``DataError`` if the data has fewer batches than ``batch_num``."""
    dev = device if device is not None else (ctx.device if ctx is not None else resolve_device(None))
    n = session.batch_num
    start, stop = ctx.block(n) if ctx is not None else (0, n)
    ckpt = _checkpointer(session, checkpoint, ctx, stop - start)
    done = ckpt.resume() if ckpt is not None else 0
    it = iter(batches)
    with session.kept_open():
        _forward_block(model, it, n, range(start + done, stop), dev, ckpt,
                       _progress_bar(quiet, ctx, stop - start, done))
        if ctx is not None:
            ctx.fold(session)
        session.batches_seen = n  # a rank's own count is its block's
        session.finish()
    if ckpt is not None:
        ckpt.remove()
    return it


def _checkpointer(session: CalibrationSession, path: Optional[str], ctx: Optional[Ranks],
                  batch_total: int) -> Optional[Checkpointer]:
    """One checkpoint file per rank (``path.rankR`` when distributed), or None."""
    if path is None:
        return None
    if ctx is not None and ctx.active:
        path = f"{path}.rank{ctx.rank}"
    return Checkpointer(session, path, batch_total=batch_total)


def _progress_bar(quiet: bool, ctx: Optional[Ranks], total: int, done: int) -> Any:
    """A tqdm bar over this process's block (rank 0 only), or None."""
    if not progress_enabled(quiet) or (ctx is not None and not ctx.is_writer):
        return None
    from tqdm import tqdm
    desc = f"calibrating (rank 0 of {ctx.world_size})" if ctx is not None and ctx.active else "calibrating"
    return tqdm(total=total, initial=done, desc=desc, unit="batch", file=sys.stderr)


def _forward_block(model: nn.Module, it: Iterator[Any], n: int, block: range, device: torch.device,
                   ckpt: Optional[Checkpointer], bar: Any) -> None:
    """Read the first ``n`` batches of ``it`` and forward those whose index is in ``block``,
    saving the checkpoint after each; the bar is closed whatever happens."""
    try:
        for i in range(n):
            batch = next(it, None)
            if batch is None:
                raise DataError(f"the calibration data has only {i} batch(es); batch_num is {n} "
                                "(give more data, or a smaller batch size / batch_num)")
            if i not in block:
                continue
            forward(model, _to(batch, device), i)
            if ckpt is not None:
                ckpt.save()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def resolve_device(device: Optional[str]) -> torch.device:
    """``None``/"auto" → CUDA when present, else CPU; anything else must be a valid device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise AmctError(f"invalid device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AmctError(f"device {device!r} requested but CUDA is not available")
    return dev
