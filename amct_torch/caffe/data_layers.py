"""A train/test net's data layers (Data, ImageData, HDF5Data, MemoryData...) as the net's inputs.

Caffe's data layers read the user's data; here they are not graph modules but data sources
(amct_torch/inputs/caffe_data/): their tops become the graph's inputs, their shapes come from
the source when it can be opened (else unknown: the graph is then built without shape checks),
and the Caffe exporters write the layers back unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional


def is_data_layer(type_name: str) -> bool:
    """True for the layer types that read data (a data source, not a graph module)."""
    from amct_torch.inputs.caffe_data import is_data_layer as known
    return bool(known(type_name))


def data_top_shapes(layers: Sequence[Any], model_file: Optional[str]) -> list[tuple[str, list[int]]]:
    """(top, shape) of every data layer's tops in Caffe's order; a shape is empty (unknown)
    when the layer's source cannot be opened now (``test`` and ``calibrate`` open it again and
    report the problem)."""
    from amct_torch.errors import AmctError
    from amct_torch.inputs.caffe_data import open_data_layer
    from amct_torch.inputs.caffe_data.paths import data_base_dir

    out: list[tuple[str, list[int]]] = []
    for layer in layers:
        shapes: dict[str, Any] = {}
        try:
            with open_data_layer(layer, base_dir=data_base_dir(model_file), warn=False) as source:
                shapes = dict(zip(source.tops, source.top_shapes()))
        except (AmctError, OSError):
            shapes = {}
        out += [(top, [int(d) for d in shapes.get(top, ())]) for top in layer.top]
    return out
