"""Writing an ONNX model whose large initializers come straight from their arrays.

Why: ``numpy_helper.from_array`` and ``SerializeToString`` each hold another copy of every
weight (the VGG-16 float model is 553 MB). The model is built with each large initializer
holding its name, type and dims only (``skeleton``) and written field by field in field-number
order, each initializer's ``raw_data`` taken from the array's memory. The bytes are those of
``SerializeToString`` on the same model built with ``from_array`` (tested byte for byte)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import BinaryIO, Union

import numpy as np
import onnx
from onnx import helper

from amct_torch.files.direct_io import DirectFile
from amct_torch.files.protowire import copy_fields, field_key, parts_size, split_before, varint

__all__ = ["skeleton", "streamable", "write_model", "STREAM_BYTES"]

#: arrays at least this large are written from their own memory
STREAM_BYTES = 1 << 16
_DTYPES = (np.float32, np.int8, np.uint8, np.int32, np.int64)

_MODEL_GRAPH, _GRAPH_INIT, _TENSOR_RAW = 7, 5, 9
_MODEL_FIELDS = [f.number for f in onnx.ModelProto.DESCRIPTOR.fields]
_GRAPH_FIELDS = [f.number for f in onnx.GraphProto.DESCRIPTOR.fields]
_TENSOR_FIELDS = [f.number for f in onnx.TensorProto.DESCRIPTOR.fields]


def streamable(arr: np.ndarray) -> bool:
    """Whether ``arr`` is written from its memory (large, of a plain numeric type)."""
    return arr.nbytes >= STREAM_BYTES and arr.ndim > 0 and any(arr.dtype == d for d in _DTYPES)


def skeleton(arr: np.ndarray, name: str) -> onnx.TensorProto:
    """``from_array(arr, name)`` without its ``raw_data``."""
    t = onnx.TensorProto()
    t.dims.extend(arr.shape)
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    return t


def _tensor_parts(t: onnx.TensorProto, arr) -> list:
    data = t.SerializeToString()
    if arr is None:
        return [data]
    flat = np.ascontiguousarray(arr).data.cast("B")
    cut = split_before(data, _TENSOR_RAW, _TENSOR_FIELDS)
    return [data[:cut], field_key(_TENSOR_RAW) + varint(flat.nbytes), flat, data[cut:]]


def write_model(f: Union[BinaryIO, DirectFile], model: onnx.ModelProto,
                external: Mapping[str, np.ndarray]) -> None:
    """Write ``model`` to ``f``, each initializer named in ``external`` (a ``skeleton``) with
    that array's bytes as its ``raw_data``."""
    graph = model.graph
    gdata = copy_fields(graph, type(graph)(), skip=("initializer",)).SerializeToString()
    gcut = split_before(gdata, _GRAPH_INIT, _GRAPH_FIELDS)
    inits: list = []
    for t in graph.initializer:
        parts = _tensor_parts(t, external.get(t.name))
        inits += [field_key(_GRAPH_INIT) + varint(parts_size(parts))] + parts
    gparts = [gdata[:gcut]] + inits + [gdata[gcut:]]
    mdata = copy_fields(model, type(model)(), skip=("graph",)).SerializeToString()
    mcut = split_before(mdata, _MODEL_GRAPH, _MODEL_FIELDS)
    f.write(mdata[:mcut])
    f.write(field_key(_MODEL_GRAPH) + varint(parts_size(gparts)))
    for p in gparts:
        f.write(p)
    f.write(mdata[mcut:])
