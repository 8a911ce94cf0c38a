"""How the one-call job turns the user's data into calibration batches, and says what it used.

Why: without an explicit batch size the job spreads every sample over ``batch_num`` batches
(a single .npz of 180 digits must not calibrate on 2 of them), keeps only the batches that
later steps read again, and tells the user how many samples calibrated.
"""
from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Iterable, Iterator, Optional

from amct_torch.inputs.data import IMAGE_EXTS, Preprocess, check_resize

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


def check_data_settings(data: Any, inputs: Any, pre: Optional[Preprocess], model_file: str) -> None:
    """Warn when --mean/--scale/--resize cannot apply (arrays are used as they are) and refuse
    a resize target beyond the image budget before any image is read."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    images = any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names)
    pre = pre or Preprocess()
    if images:
        shape = inputs[0][1]
        hw = (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None
        check_resize(hw, pre, model_file)
    elif pre.mean is not None or pre.scale != 1.0 or pre.resize is not None or pre.crop is not None:
        log.warning("--mean/--scale/--resize/--crop apply to images only: the arrays of %s are "
                    "used as they are", path)


def preprocessed_sample_shape(data: Any, inputs: Any, pre: Optional[Preprocess]) -> Optional[tuple]:
    """The shape of one image sample after ``pre`` (channels, height, width), known before any
    image is read: the crop, else the resize (one number: the shorter side, so at least that
    square), else the net's declared size. None for arrays (used as they are) or no images."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return None
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    shape = inputs[0][1]
    if not any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names) or not shape or len(shape) != 4:
        return None
    pre = pre or Preprocess()
    target = pre.crop if pre.crop is not None else pre.resize
    if target is None:
        return tuple(int(d) for d in shape[1:])
    sizes = [int(target)] if isinstance(target, int) else [int(v) for v in target]
    h, w = sizes[0], sizes[-1]
    return (int(shape[1]), h, w)


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
                first = b[0] if isinstance(b, tuple) else b
                self.samples += int(first.shape[0]) if getattr(first, "dim", lambda: 0)() else 1
            yield b


def check_held_out_images(data: Any, inputs: Any, pre: Optional[Preprocess], start: int, count: int) -> None:
    """Decode, before calibration, the images of a data folder that the per-layer report will
    read after it (samples ``start`` .. ``start + count``): one that cannot be read is a
    ``DataError`` naming it now, not after the calibration and the writes."""
    from amct_torch.inputs.data import data_folder_files, load_image
    if not isinstance(data, (str, os.PathLike)) or not inputs or not os.path.isdir(data):
        return
    files = data_folder_files(os.fspath(data))
    if not files or os.path.splitext(files[0])[1].lower() not in IMAGE_EXTS:
        return
    shape = inputs[0][1]
    channels = int(shape[1]) if shape and len(shape) == 4 else 3
    hw = (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None
    for path in files[start:start + count]:
        load_image(path, pre or Preprocess(), channels, hw)


def report_use(keeper: Keep, count: Optional[int], batch_num: int, bs: Optional[int],
               held_out_batches: int = 0) -> None:
    """Log how many samples calibrated and warn when some were left out (the per-layer report's
    held-out rows, the ``held_out_batches`` after the calibration batches, are not unused)."""
    if count is None:
        return
    rest = count - keeper.samples
    held = min(rest, held_out_batches * bs) if bs else 0
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
        first = b[0] if isinstance(b, tuple) else b
        seen += int(first.shape[0]) if getattr(first, "dim", lambda: 0)() else 1
    return taken, itertools.chain(taken, rest)


class NetData:
    """A train/test net's own TEST-phase data layers as calibration batches (``calibrate``
    without DATA): the layers' batches (their ``batch_size``, or ``batch_size`` rows when
    given), each a tensor, or a tuple in the graph's input order for several inputs; endless
    (the sources wrap round as Caffe's do), so the batches after the calibration's are the
    held-out ones."""

    def __init__(self, gm: Any, model_file: str, batch_size: Optional[int] = None) -> None:
        from amct_torch.errors import DataError
        from amct_torch.quality.net_scores import PhaseData

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
