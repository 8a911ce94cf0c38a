"""A net's TEST-phase data layers read together as one source of batches.

Why: ``amct-torch test`` scores on them and ``calibrate`` without DATA calibrates on them; both
need the layers opened beside the prototxt, one batch size, and their tops merged per batch.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from amct_torch.errors import ModelError
from amct_torch.inputs.caffe_data.layers import open_data_layer
from amct_torch.inputs.caffe_data.paths import data_base_dir
from amct_torch.inputs.caffe_data.source import DataSource


class PhaseData:
    """The net's TEST-phase data layers as one source of batches (their tops merged)."""

    def __init__(self, data_layers: Sequence[Any], model_file: str) -> None:
        if not data_layers:
            raise ModelError("the net has no data layer in the TEST phase: 'test' runs a train/test "
                             "net (a deploy net has no labels)", file=model_file)
        self.model_file = model_file
        self.sources: list[DataSource] = []
        try:  # a source opened before one that fails is closed again (a LevelDB stays locked)
            for layer in data_layers:
                self.sources.append(open_data_layer(layer, base_dir=data_base_dir(model_file)))
            sizes = {int(s.batch_size) for s in self.sources}
            if len(sizes) != 1:
                raise ModelError(f"the TEST data layers have different batch sizes {sorted(sizes)}",
                                 file=model_file)
        except BaseException:
            self.close()
            raise
        self.batch_size = sizes.pop()

    def batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches from batch ``start`` on, endlessly: each source wraps round at its end, as
        Caffe's data layers do."""
        its = [s.batches(start=start) for s in self.sources]
        while True:
            merged: dict[str, np.ndarray] = {}
            for it in its:
                merged.update(next(it))
            yield merged

    def close(self) -> None:
        for s in self.sources:
            s.close()
