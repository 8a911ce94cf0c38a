"""Data layers that read no files: ``DummyData`` (filler values) and ``MemoryData`` (its
arrays come from the user's program, so only its shape is known here).

DummyData as Caffe fills it: ``constant`` fillers exactly; ``uniform`` and ``gaussian`` from
a generator seeded by the batch number (deterministic, not Caffe's own random stream); other
fillers are refused.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.source import DataSource
from amct_torch.proto import amct_caffe_pb2 as pb


class DummySource(DataSource):
    """The ``DummyData`` layer ``layer``: one shape and one filler per top."""

    def __init__(self, layer: pb.LayerParameter) -> None:
        p = layer.dummy_data_param
        tops = tuple(layer.top)
        if p.shape:
            shapes = [tuple(int(d) for d in s.dim) for s in p.shape]
        else:
            legacy = [list(p.num), list(p.channels), list(p.height), list(p.width)]
            n = max((len(v) for v in legacy), default=0)
            shapes = [tuple(int(v[i] if len(v) > 1 else v[0]) for v in legacy)
                      for i in range(n)] if all(legacy) else []
        if len(shapes) == 1 and len(tops) > 1:
            shapes = shapes * len(tops)
        if len(shapes) != len(tops) or any(not s or min(s) < 1 for s in shapes):
            raise DataError(f"dummy_data_param gives the shapes {shapes} for the tops "
                            f"{list(tops)}", layer=layer.name)
        fillers = list(p.data_filler) or [pb.FillerParameter()]
        if len(fillers) == 1:
            fillers = fillers * len(tops)
        if len(fillers) != len(tops):
            raise DataError(f"dummy_data_param gives {len(fillers)} data_filler for "
                            f"{len(tops)} tops", layer=layer.name)
        for f in fillers:
            if f.type not in ("constant", "uniform", "gaussian"):
                raise DataError(f"DummyData filler '{f.type}' is not supported (constant, "
                                "uniform, gaussian are)", layer=layer.name)
        super().__init__(layer.name, tops, shapes[0][0], None)
        self._shapes, self._fillers = shapes, fillers
        self._check_batch_bytes()

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self._shapes)

    def batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        n = start
        while True:
            rng = np.random.default_rng(n)
            yield {t: _fill(f, s, rng) for t, s, f in zip(self.tops, self._shapes, self._fillers)}
            n += 1


def _fill(f: pb.FillerParameter, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if f.type == "constant":
        return np.full(shape, f.value, np.float32)
    if f.type == "uniform":
        return rng.uniform(f.min, f.max, shape).astype(np.float32)
    return rng.normal(f.mean, f.std, shape).astype(np.float32)


class MemorySource(DataSource):
    """The ``MemoryData`` layer ``layer``: its shape; its batches need the user's arrays."""

    def __init__(self, layer: pb.LayerParameter) -> None:
        p = layer.memory_data_param
        super().__init__(layer.name, tuple(layer.top), p.batch_size, None)
        self._shape = (p.batch_size, p.channels, p.height, p.width)

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [self._shape, (self.batch_size,)][:len(self.tops)]

    def batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        raise DataError("a MemoryData layer takes its arrays from the user's program; give "
                        "the data yourself (the DATA argument, or arrays through the API)",
                        layer=self.name)
