"""Calibration data for nets with several inputs from one ``.npz`` file: one member per net
input, named after it (Faster R-CNN / R-FCN: ``data`` and ``im_info``), samples along the
first axis of every member.

Why a file of its own: a path is otherwise read as the samples of a single input; a net with a
second input (the image size ``im_info`` of the R-CNN detectors) needs its arrays paired row by
row, and that pairing (equal sample counts, every input present, nothing else) is checked here
before any batch is built, so a wrong file fails with the names the net expects.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch

from amct_torch.errors import DataError


def _members(path: str, names: Sequence[str], array_file: Callable) -> tuple[Any, list]:
    """The open archive and one lazily read array per input name (``array_file``: the lazy
    reader of ``inputs.data``, passed in so that this module does not import it back)."""
    import zipfile

    from amct_torch.inputs.limits import check_regular_file
    if not path.lower().endswith(".npz"):
        raise DataError(f"data from a path for a net with several inputs must be one .npz file with one array "
                        f"per input, named {', '.join(names)} (np.savez(f, {'=..., '.join(names)}=...)); "
                        "or pass an iterable of tuples", file=path)
    check_regular_file(path, ".npz file")
    try:
        z = zipfile.ZipFile(path)
        keys = [n[:-4] for n in z.namelist() if n.endswith(".npy")]
    except Exception as err:  # noqa: BLE001 - whatever zipfile raises on a broken archive
        raise DataError(f"cannot read the .npz file: {type(err).__name__}: {err}", file=path) from None
    missing = [n for n in names if n not in keys]
    if missing:
        z.close()
        raise DataError(f"the .npz file has no array for input(s) {', '.join(missing)}: a net with several "
                        f"inputs takes one array per input, named {', '.join(names)} (it holds "
                        f"{', '.join(sorted(keys)) or 'none'})", file=path)
    return z, [array_file(path, n + ".npy", archive=z) for n in names]


def _count(path: str, arrays: list) -> int:
    counts = {a.member[:-4]: a.rows_total for a in arrays}
    if len(set(counts.values())) != 1:
        raise DataError(f"the inputs' arrays hold different numbers of samples: "
                        f"{', '.join(f'{k} {v}' for k, v in counts.items())}", file=path)
    return next(iter(counts.values()))


def named_npz_samples(path: str, inputs: Sequence[tuple[str, object]], array_file: Callable) -> int:
    """The number of samples (rows shared by every input's array) of the file."""
    path = os.fspath(path)
    z, arrays = _members(path, [n for n, _ in inputs], array_file)
    try:
        return _count(path, arrays)
    finally:
        z.close()


def named_npz_batches(path: str, specs: Sequence, batch_size: int,
                      array_file: Callable) -> Iterator[tuple[torch.Tensor, ...]]:
    """Tuples of ``batch_size`` rows of every input's array, in the net's input order, each
    checked against its input's declared shape."""
    path = os.fspath(path)
    z, arrays = _members(path, [s.name for s in specs], array_file)
    try:
        total = _count(path, arrays)
        for s, a in zip(specs, arrays):
            s.check_shape(list(a.shape), f"{path}:{s.name}")
        for start in range(0, total, batch_size):
            yield tuple(s.check(a.rows(start, batch_size), f"{path}:{s.name}") for s, a in zip(specs, arrays))
    finally:
        z.close()
