"""The calibration loop the one-call API and the CLI run for the user: ``batch_num`` forwards
of the model ``quantize_model`` returned, with a progress bar.

Why its own file: an AMCT user writes this loop themselves; ours adds what a tool owes its
user — a tqdm bar (silent when stderr is not a terminal or when asked), data errors turned
into ``DataError`` naming the batch and its shape, and a clear error when the data runs out
before ``batch_num`` batches.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from amct_torch.calibration.session import CalibrationSession
from amct_torch.errors import AmctError, DataError
from amct_torch.progress import progress_enabled  # noqa: F401  (re-exported: distributed uses it)


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, tuple):
        return tuple(b.to(device) for b in batch)
    return batch.to(device)


def _shape(batch: Any) -> str:
    if isinstance(batch, tuple):
        return ", ".join(str(list(b.shape)) for b in batch)
    return str(list(batch.shape))


def forward(model: nn.Module, batch: Any, index: int) -> Any:
    """One forward; a failure that is not one of ours means the data does not fit the net."""
    try:
        with torch.no_grad():
            return model(*batch) if isinstance(batch, tuple) else model(batch)
    except AmctError:
        raise
    except (RuntimeError, ValueError, IndexError) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"the model cannot run on calibration batch {index} shaped "
                        f"{_shape(batch)}: {msg}") from None


def run_calibration(model: nn.Module, session: CalibrationSession, batches: Iterable[Any],
                    device: torch.device, quiet: bool = False) -> Iterator[Any]:
    """Run ``session.batch_num`` batches of ``batches`` through ``model`` on ``device``.

    Returns an iterator over the batches that were not consumed (held-out data for a report).
    Raises ``DataError`` if the data has fewer batches than ``batch_num``."""
    it = iter(batches)
    bar = None
    if progress_enabled(quiet):
        from tqdm import tqdm
        bar = tqdm(total=session.batch_num, desc="calibrating", unit="batch", file=sys.stderr)
    try:
        for i in range(session.batch_num):
            batch = next(it, None)
            if batch is None:
                raise DataError(f"the calibration data has only {i} batch(es); batch_num is "
                                f"{session.batch_num} (give more data, or a smaller batch size / "
                                "batch_num)")
            forward(model, _to(batch, device), i)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if not session.done:
        session.finish()
    return it


def take(it: Iterator[Any], n: int) -> list:
    """Up to ``n`` items of ``it``."""
    out = []
    for _ in range(n):
        item = next(it, None)
        if item is None:
            break
        out.append(item)
    return out


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
