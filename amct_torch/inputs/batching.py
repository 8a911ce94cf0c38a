"""The pieces of a batch plan: the default batch size, the batches kept for later steps, the
held-out batches, the net's own data layers as batches, and what calibration used.

Why: without an explicit batch size the job spreads every sample over ``batch_num`` batches
(a single .npz of 180 digits must not calibrate on 2 of them), keeps only the batches that
later steps read again, and tells the user how many samples calibrated (plan.py puts them
together).
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Optional

log = logging.getLogger("amct_torch")

#: samples beyond the calibration batches read for the improvements' guard (where the data has them)
HELD_ROWS = 64

#: most samples in one batch when the batch size is derived from the data (documented in
#: docs/workflow.md): beyond it the remaining samples stay unused, with a warning
MAX_DEFAULT_BATCH = 256


def default_batch_size(count: Optional[int], batch_num: int) -> Optional[int]:
    """Spread ``count`` samples over ``batch_num`` batches (at most ``MAX_DEFAULT_BATCH`` per
    batch); None (one sample per item) when the count is unknown."""
    if not count:
        return None
    return max(1, min(MAX_DEFAULT_BATCH, -(-count // batch_num)))


def batch_rows(batch: Any) -> int:
    """Samples in one batch: its (first) tensor's first dimension; 1 for a 0-d value."""
    first = batch[0] if isinstance(batch, tuple) else batch
    return int(first.shape[0]) if getattr(first, "dim", lambda: 0)() else 1


class Keep:
    """Passes batches on, remembering the first ``n`` (at most ``limit`` of them when given:
    what later steps read again) and counting their samples."""

    def __init__(self, limit: Optional[int] = None) -> None:
        self.cache: list = []
        self.samples = 0
        self.limit = limit

    def __call__(self, batches: Iterable[Any], n: int) -> Iterable[Any]:
        self.cache = []
        self.samples = 0
        for i, b in enumerate(batches):
            if i < n:
                if self.limit is None or len(self.cache) < self.limit:
                    self.cache.append(b)
                self.samples += batch_rows(b)
            yield b


def report_use(keeper: Keep, count: Optional[int], batch_num: int, bs: Optional[int],
               held_batches: int = 0) -> None:
    """Log how many samples calibrated and warn when some were left out (the per-layer report's
    held-out rows, the ``held_batches`` after the calibration batches, are not unused)."""
    if count is None:
        return
    rest = count - keeper.samples
    held = min(rest, held_batches * bs) if bs else 0
    unused = rest - held
    if unused > 0:
        also = f"; {held} more held out for the per-layer report" if held else ""
        log.warning("calibrated on %d of %d samples (%d batch(es) of %s)%s: %d sample(s) unused; "
                    "raise --batch-num or --batch-size to use them", keeper.samples, count,
                    batch_num, bs, also, unused)
    elif held:
        log.info("calibrated on %d of %d samples; the other %d held out for the per-layer report",
                 keeper.samples, count, held)
    else:
        log.info("calibrated on all %d samples", count)


def held_out_batches(rest: Iterator[Any], batches: int, rows: int = HELD_ROWS) -> tuple[list, Iterator[Any]]:
    """The batches after the calibration ones that the improvements' guard judges on: at least
    ``batches`` of them (what the per-layer report reads) and enough for ``rows`` samples, where
    the data has them; and ``rest`` again from its start (the same batches first, so the
    report reads the rows the guard saw)."""
    taken: list = []
    seen = 0
    while len(taken) < batches or seen < rows:
        b = next(rest, None)
        if b is None:
            break
        taken.append(b)
        seen += batch_rows(b)
    return taken, itertools.chain(taken, rest)


class NetData:
    """A train/test net's own TEST-phase data layers as calibration batches (``calibrate``
    without DATA): the layers' batches (their ``batch_size``, or ``batch_size`` rows when
    given), each a tensor, or a tuple in the graph's input order for several inputs; endless
    (the sources wrap round as Caffe's do), so the batches after the calibration's are the
    held-out ones."""

    def __init__(self, gm: Any, model_file: str, batch_size: Optional[int] = None) -> None:
        from amct_torch.errors import DataError
        from amct_torch.inputs.caffe_data import PhaseData

        layers = gm.meta.get("caffe_data_layers", [])
        if not layers:
            raise DataError("no calibration data given and the net has no data layer in the TEST "
                            "phase: give DATA (images, .npy/.npz) or a train/test prototxt",
                            file=model_file)
        self.data = PhaseData(layers, model_file)
        self.names = [n for n, _ in gm.caffe_inputs]
        self.batch_size = int(batch_size) if batch_size is not None else self.data.batch_size

    def batches(self) -> Iterable[Any]:
        import numpy as np
        import torch

        pending: list[dict] = []
        rows = 0
        try:
            for batch in self.data.batches():
                pending.append(batch)
                rows += int(next(iter(batch.values())).shape[0])
                while rows >= self.batch_size:
                    joined = {n: np.concatenate([b[n] for b in pending]) for n in self.names}
                    out = tuple(torch.from_numpy(joined[n][:self.batch_size].copy()) for n in self.names)
                    rest = {n: joined[n][self.batch_size:] for n in self.names}
                    rows -= self.batch_size
                    pending = [rest] if rows else []
                    yield out[0] if len(out) == 1 else out
        finally:
            self.data.close()

    def close(self) -> None:
        """Release the sources' databases and threads."""
        self.data.close()
