"""Caffe's ``HDF5Data`` layer: ``source`` lists ``.h5`` files (whitespace-separated, as
Caffe reads it); each top is the dataset of the same name, its first axis the items.

As Caffe's HDF5DataLayer: no transform_param (refused when given); items in file order, then the next file, back
to the first after the last; every top's dataset must have the same number of items in a
file; integer datasets are read as float. ``shuffle`` is random in Caffe and not applied.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.optional_deps import require
from amct_torch.inputs.caffe_data.paths import resolve
from amct_torch.inputs.caffe_data.source import RecordSource
from amct_torch.inputs.limits import check_regular_file
from amct_torch.proto import amct_caffe_pb2 as pb

#: largest HDF5 list file read
MAX_LIST_BYTES = 64 << 20


class Hdf5Source(RecordSource):
    """The ``HDF5Data`` layer ``layer`` reading the list file ``path``."""

    def __init__(self, layer: pb.LayerParameter, path: str, base_dir: Optional[str],
                 *, threads: Optional[int] = None) -> None:
        h5py = require("h5py", "HDF5 data", path)
        check_regular_file(path, "HDF5 list file")
        if os.path.getsize(path) > MAX_LIST_BYTES:
            raise DataError(f"the list file is larger than {MAX_LIST_BYTES} bytes", file=path)
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            names = f.read().split()
        if not names:
            raise DataError("the HDF5 list file names no files", file=path, layer=layer.name)
        tops = tuple(layer.top)
        if not tops:
            raise DataError("an HDF5Data layer needs at least one top", layer=layer.name)
        self.files: list[Any] = []
        try:
            self._open_all(h5py, names, tops, layer, path, base_dir, threads)
        except BaseException:
            for h5 in self.files:
                h5.close()
            raise

    def _open_all(self, h5py: Any, names: list[str], tops: tuple[str, ...],
                  layer: pb.LayerParameter, path: str, base_dir: Optional[str],
                  threads: Optional[int]) -> None:
        self.rows: list[int] = []
        item_shapes: Optional[list[tuple[int, ...]]] = None
        for name in names:
            fpath = resolve(name, base_dir, "HDF5 file", layer.name, file=path)
            try:
                h5 = h5py.File(fpath, "r")
            except OSError as err:
                raise DataError(f"not a readable HDF5 file ({err})", file=fpath,
                                layer=layer.name) from None
            self.files.append(h5)
            sets = []
            for top in tops:
                ds = h5.get(top)
                if not isinstance(ds, h5py.Dataset):
                    raise DataError(f"the file has no dataset '{top}' for the layer's top "
                                    f"'{top}'", file=fpath, layer=layer.name)
                if ds.ndim < 1 or ds.dtype.kind not in "fiub":
                    raise DataError(f"dataset '{top}' is {ds.dtype} of shape {ds.shape}; "
                                    "Caffe reads numeric datasets of at least one axis",
                                    file=fpath, layer=layer.name)
                sets.append(ds)
            counts = {ds.shape[0] for ds in sets}
            if len(counts) != 1 or 0 in counts:
                raise DataError("the tops' datasets hold different or no numbers of items ("
                                + ", ".join(f"{t}: {ds.shape[0]}" for t, ds in zip(tops, sets))
                                + ")", file=fpath, layer=layer.name)
            shapes = [tuple(int(d) for d in ds.shape[1:]) for ds in sets]
            if item_shapes is None:
                item_shapes = shapes
            elif shapes != item_shapes:
                raise DataError(f"items of shapes {shapes}, the first file's are "
                                f"{item_shapes}", file=fpath, layer=layer.name)
            self.rows.append(counts.pop())
        super().__init__(layer.name, tops, layer.hdf5_data_param.batch_size, sum(self.rows),
                         file=path, threads=threads)
        self._item_shapes = item_shapes or []
        self._check_batch_bytes()

    def _records(self, first: int) -> Iterator[tuple[int, int]]:
        f = 0
        while first >= self.rows[f]:
            first -= self.rows[f]
            f += 1
        row = first
        while True:
            yield f, row
            row += 1
            if row == self.rows[f]:
                f, row = (f + 1) % len(self.rows), 0

    def _fill(self, record: tuple[int, int], outs: dict[str, np.ndarray], i: int) -> None:
        f, row = record
        for top in self.tops:
            try:
                outs[top][i] = self.files[f][top][row]
            except OSError as err:
                raise DataError(f"cannot read item {row} of dataset '{top}' ({err})",
                                file=self.files[f].filename, layer=self.name) from None

    def close(self) -> None:
        super().close()
        for h5 in self.files:
            h5.close()
        self.files = []
