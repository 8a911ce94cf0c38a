"""The checks every ONNX model passes before it is written: ``onnx.checker`` (full check, strict
shape inference) and, when ONNX Runtime is installed, an ``InferenceSession`` on it with all
graph optimizations.

Why both: the checker proves the model follows the standard, but a runtime's own rewrites at
load can still refuse a valid model; a failure is an ``ExportError`` naming the user's model
file and, where it can, the Caffe layer. A file is checked through a view of it (``file_view``)
whose large initializers are external-data references to the file's own bytes, so neither
checker holds another copy of the weights; ORT's prepacking is off for the check.
docs/performance.md has the memory figures."""
from __future__ import annotations

import importlib.util
import logging
import mmap
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, Optional, Union

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from amct_torch.errors import ExportError
from amct_torch.files.atomic import remove_quietly, temp_beside
from amct_torch.files.protowire import LENGTH_DELIMITED, MalformedWire, field_key, fields, read_varint, varint

log = logging.getLogger("amct_torch")

LayerOf = Callable[[str], Optional[str]]
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")
_warned: list[bool] = []


def runtime_available() -> bool:
    """True when ``onnxruntime`` can be imported (it is an optional dependency)."""
    return importlib.util.find_spec("onnxruntime") is not None


def runtime_status() -> str:
    """How written models are checked, in words (for summaries and ``inspect``)."""
    if not runtime_available():
        return "onnx.checker only (onnxruntime is not installed)"
    import onnxruntime as ort
    return f"onnx.checker and ONNX Runtime {ort.__version__}"


def _fail(what: str, detail: str, file: Optional[str], layer_of: LayerOf, by: str) -> ExportError:
    detail = _ORT_PREFIX.sub("", " ".join(str(detail).split()))
    layer = layer_of(detail)
    hint = (" (a defect of amct_torch's ONNX writer: please report it; leaving the layer "
            "unquantized or cutting the export before it with --onnx-outputs avoids it)") if layer else \
        " (a defect of amct_torch's ONNX writer: please report it)"
    return ExportError(f"ONNX export: {by} refuses {what}: {detail}{hint}", file=file, layer=layer)


#: initializers whose data is at least this large are referenced in a file's view, not copied
VIEW_BYTES = 1 << 16

_MODEL_GRAPH, _GRAPH_INIT = 7, 5  # ModelProto.graph, GraphProto.initializer
_T_DIMS, _T_TYPE, _T_RAW = 1, 2, 9  # TensorProto.dims, data_type, raw_data
#: TensorProto's other value fields (float_data, int32_data, string_data, int64_data,
#: double_data, uint64_data), external_data and data_location: a tensor with any of them is
#: left as the file has it
_T_OTHER_DATA = {4, 5, 6, 7, 10, 11, 13, 14}
_ITEMSIZE: dict[int, int] = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT8: 1,
             onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4,
             onnx.TensorProto.INT64: 8, onnx.TensorProto.BOOL: 1, onnx.TensorProto.FLOAT16: 2,
             onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.UINT32: 4, onnx.TensorProto.UINT64: 8,
             onnx.TensorProto.BFLOAT16: 2}


def _referenced(buf, start: int, end: int, location: str) -> Optional[bytes]:
    """The TensorProto ``buf[start:end]`` with its ``raw_data`` as an external-data reference
    (``location``, the payload's offset and length), or None to keep it as it is: a small
    tensor, one with another value field or external data already, or raw data whose length
    does not match its dims and type (the checkers then see exactly what the file holds)."""
    kept = bytearray()
    raw: Optional[tuple[int, int]] = None
    dims: list[int] = []
    dtype = 0
    for number, wire, s, body, e in fields(buf, start, end):
        if number in _T_OTHER_DATA or (number == _T_RAW and (raw is not None or wire != LENGTH_DELIMITED)) \
                or (number == _T_TYPE and wire != 0) or (number == _T_DIMS and wire not in (0, LENGTH_DELIMITED)):
            return None
        if number == _T_RAW:
            raw = (body, e - body)
            continue
        if number == _T_DIMS:
            if wire == LENGTH_DELIMITED:  # packed
                pos = body
                while pos < e:
                    d, pos = read_varint(buf, pos, e)
                    dims.append(d)
            else:
                dims.append(read_varint(buf, body, e)[0])
        elif number == _T_TYPE:
            dtype = read_varint(buf, body, e)[0]
        kept += buf[s:e]
    if raw is None or raw[1] < VIEW_BYTES or dtype not in _ITEMSIZE \
            or raw[1] != int(np.prod(dims, dtype=np.int64)) * _ITEMSIZE[dtype]:
        return None
    t = onnx.TensorProto()
    try:
        t.ParseFromString(bytes(kept))
    except DecodeError:
        return None
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t.SerializeToString()


def file_view(path: str) -> Optional[bytes]:
    """The ONNX model file at ``path`` as a serialised ModelProto whose main graph's large
    initializers (``VIEW_BYTES``) are external data pointing at their own ``raw_data`` bytes in
    ``path`` (location: its file name); every other byte is the file's. None when the file is
    not a well-formed message or holds no such initializer (check the file itself then)."""
    location = os.path.basename(path)
    out = bytearray()
    changed = False
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                for number, wire, s, p0, e in fields(buf, 0, len(buf)):
                    if number != _MODEL_GRAPH or wire != LENGTH_DELIMITED:
                        out += buf[s:e]
                        continue
                    graph = bytearray()
                    for gnum, gwire, gs, g0, ge in fields(buf, p0, e):
                        init = gnum == _GRAPH_INIT and gwire == LENGTH_DELIMITED
                        ref = _referenced(buf, g0, ge, location) if init else None
                        if ref is None:
                            graph += buf[gs:ge]
                        else:
                            graph += field_key(_GRAPH_INIT) + varint(len(ref)) + ref
                            changed = True
                    out += field_key(_MODEL_GRAPH) + varint(len(graph)) + graph
            except MalformedWire:
                return None
    return bytes(out) if changed else None


@contextmanager
def _viewed(path: str) -> Iterator[str]:
    """The path of ``file_view(path)`` written beside ``path`` (removed afterwards), or
    ``path`` itself when there is no view."""
    data = file_view(path)
    if data is None:
        yield path
        return
    fd, view = temp_beside(path, ".view")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield view
    finally:
        remove_quietly(view)


def check_structure(model: Union[onnx.ModelProto, str], file: Optional[str], layer_of: LayerOf,
                    what: str) -> None:
    """``onnx.checker.check_model(full_check=True)`` on a model or a model file's path (through
    its view, ``file_view``); an ExportError naming ``file`` and the layer otherwise."""
    try:
        if isinstance(model, str):
            with _viewed(model) as path:
                onnx.checker.check_model(path, full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise _fail(what, str(err), file, layer_of, "onnx.checker") from None


def check_runtime(data: Union[bytes, str], file: Optional[str], layer_of: LayerOf, what: str) -> bool:
    """Create an ONNX Runtime session (CPU, default optimizations) on the serialised model
    ``data`` (or the model file at that path, through its view without prepacking: see the
    module's docstring); an ExportError naming ``file`` and the layer when ORT refuses it.
    Returns False (after one warning per process) when onnxruntime is not installed."""
    if not runtime_available():
        if not _warned:
            _warned.append(True)
            log.warning("onnxruntime is not installed: the ONNX models are checked with "
                        "onnx.checker only (pip install onnxruntime to check that a runtime loads them)")
        return False
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: no notes about unused initializers
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    try:
        if isinstance(data, str):
            opts.add_session_config_entry("session.disable_prepacking", "1")
            with _viewed(data) as path:
                session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
                del session  # its memory maps of the file go before the view does
        else:
            ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own exception types for any refusal
        raise _fail(what, str(err), file, layer_of, "ONNX Runtime") from None
    return True
