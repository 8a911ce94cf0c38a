"""Reading and writing Caffe models (prototxt + caffemodel) as ``NetParameter`` messages.

This is the only place that touches Caffe files: it turns user files into a deploy net
(new ``layer`` format, TEST phase, inputs, float32 blobs by layer name) and writes nets and
graphs back, atomically. Every problem with a user's file is a ``ModelError`` naming the file
(and the layer where there is one). See docs/caffe_format.md for the rules implemented here.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from google.protobuf import message as _message
from google.protobuf import text_format

from amct_torch.arguments import checked, instance, opt, path_arg
from amct_torch.arguments import graph_module as _graph_module
from amct_torch.caffe import prototxt as _ptx
from amct_torch.caffe.blob_shape import LEGACY_DIMS, MAX_BLOB_AXES, blob_shape, check_value_count
from amct_torch.caffe.duplicate_names import USER_NAME, rename_duplicates
from amct_torch.caffe.limits import check_caffemodel_counts, check_prototxt_counts
from amct_torch.caffe.unknown_fields import unknown_fields
from amct_torch.caffe.upgrade import upgrade_v1 as _upgrade_v1
from amct_torch.errors import ModelError
from amct_torch.files.atomic import atomic_write_bytes
from amct_torch.files.protowire import copy_fields, varint
from amct_torch.inputs.limits import check_regular_file
from amct_torch.proto import amct_caffe_pb2 as pb

__all__ = ["ParsedNet", "parse_prototxt", "parse_caffemodel", "upgrade_v1", "read_net",
           "write_net", "net_to_prototxt_text", "save_caffe", "blob_to_array", "array_to_blob",
           "layer_included"]


@dataclass
class ParsedNet:
    """A deploy net ready for the graph builder.

    ``net``: the NetParameter in new ``layer`` format with only TEST-phase layers and no blobs;
    ``inputs``: ``(blob name, shape)`` in Caffe's order (``input`` fields first, then Input
    layers, then the data layers' tops, shape [] when unknown); ``layers``: the layers after
    phase filtering, Input and data layers left out; ``blobs``:
    float32 arrays by layer name, from the caffemodel (or from the prototxt if it has any).
    """
    net: pb.NetParameter
    inputs: list[tuple[str, list[int]]]
    layers: list[pb.LayerParameter]
    blobs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    model_file: Optional[str] = None
    weights_file: Optional[str] = None
    #: a train/test net's data layers (left out of ``layers``; their tops are in ``inputs``)
    data_layers: list[pb.LayerParameter] = field(default_factory=list)


def _read_bytes(path: str) -> bytes:
    check_regular_file(path, "file", ModelError)  # a FIFO or device would block the read
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ModelError(f"cannot read file: {err.strerror or err}", file=path) from err


def _syntax_error(err: text_format.ParseError, path: str) -> ModelError:
    line = err.GetLine() if hasattr(err, "GetLine") else None
    msg = str(err)
    if line is not None:  # the message starts with "line:col : "
        msg = msg.split(" : ", 1)[-1]
    return ModelError(f"prototxt syntax error: {msg}", file=path, line=line)


#: the last prototxt parsed cleanly: (its bytes, the net). One job reads the same prototxt
#: several times (quant config, init, layer infos); a parse costs 0.1-0.3 s on a ResNet-50,
#: a copy of the parsed net ~1 ms. Keyed by content, so an edited file is parsed again.
_LAST_PARSED: list = []


def parse_prototxt(path: str) -> pb.NetParameter:
    """Parse a text prototxt. Fields unknown to our schema are kept (see prototxt.py);
    a syntax error is a ModelError with the file and line; an empty file is a ModelError."""
    path = os.fspath(path)
    raw = _read_bytes(path)
    if _LAST_PARSED and _LAST_PARSED[0] == raw:
        return _copy(_LAST_PARSED[1])
    check_prototxt_counts(raw, path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelError(f"not a text prototxt (not UTF-8 at byte {err.start})", file=path) from err
    net = pb.NetParameter()
    try:  # most prototxts hold only fields the schema knows: then the tolerant walk is not needed
        text_format.Parse(text, net)
    except (text_format.ParseError, RecursionError):
        net = None
    if net is not None and net.ByteSize() > 0:
        _ptx.refuse_nan(net, path)
        _LAST_PARSED[:] = [raw, _copy(net)]
        return net
    stripped, entries = _ptx.strip_unknown_fields(text, pb.NetParameter.DESCRIPTOR)
    net = pb.NetParameter()
    try:
        text_format.Parse(stripped, net)
        _ptx.attach_unknown(net, entries)
    except RecursionError:
        raise ModelError("prototxt blocks are nested too deeply", file=path) from None
    except text_format.ParseError as err:
        # The tolerant pass gave up (broken structure): parse again skipping unknown fields,
        # so that the error reported is the real syntax error, not the first unknown field.
        net = pb.NetParameter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                text_format.Parse(text, net, allow_unknown_field=True)
            except text_format.ParseError as err2:
                raise _syntax_error(err2, path) from err2
            except RecursionError:
                raise ModelError("prototxt blocks are nested too deeply", file=path) from None
        warnings.warn(f"{path}: unknown fields could not be kept and were dropped ({err})", stacklevel=2)
        if net.ByteSize() == 0:
            raise ModelError("empty prototxt (no net definition)", file=path) from None
        _ptx.refuse_nan(net, path)
        return net  # not remembered: a later read warns again
    if net.ByteSize() == 0:
        raise ModelError("empty prototxt (no net definition)", file=path)
    _ptx.refuse_nan(net, path)
    _LAST_PARSED[:] = [raw, _copy(net)]
    return net


def _copy(net: pb.NetParameter) -> pb.NetParameter:
    out = pb.NetParameter()
    out.CopyFrom(net)
    return out


def parse_caffemodel(path: str) -> pb.NetParameter:
    """Parse a binary caffemodel; empty, truncated or corrupt files are ModelErrors.

    Note: a file cut exactly between two top-level fields is still valid protobuf and cannot
    be told apart from a smaller net; that case shows up later as missing weights."""
    path = os.fspath(path)
    raw = _read_bytes(path)
    if not raw:
        raise ModelError("empty caffemodel", file=path)
    check_caffemodel_counts(raw, path)
    net = pb.NetParameter()
    try:
        net.ParseFromString(raw)
    except (_message.DecodeError, ValueError, RuntimeError) as err:
        raise ModelError(f"corrupt or truncated caffemodel ({err})", file=path) from err
    if not net.layer and not net.layers:
        raise ModelError("caffemodel holds no layers (corrupt, or not a caffemodel)", file=path)
    return net


def upgrade_v1(net: pb.NetParameter, file: Optional[str] = None) -> pb.NetParameter:
    """V1 ``layers`` (enum types, blobs_lr, ...) converted to the new ``layer`` format (a copy)."""
    return _upgrade_v1(net, file)


def _rule_met(rule: pb.NetStateRule, state: pb.NetState) -> bool:
    """Caffe's StateMeetsRule."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    if any(s not in state.stage for s in rule.stage):
        return False
    return not any(s in state.stage for s in rule.not_stage)


def layer_included(layer: pb.LayerParameter, state: pb.NetState, file: Optional[str] = None) -> bool:
    """Caffe's include/exclude rules: with include rules a layer is kept iff one is met; with
    exclude rules it is dropped iff one is met; with neither it is kept."""
    if layer.include and layer.exclude:
        raise ModelError("layer has both include and exclude rules", file=file, layer=layer.name)
    if layer.include:
        return any(_rule_met(r, state) for r in layer.include)
    return not any(_rule_met(r, state) for r in layer.exclude)


#: ``raw_data_type`` → the little-endian dtype of ``raw_data`` (NVIDIA Caffe's field, written by
#: ``cv2.dnn.shrinkCaffeModel`` as FLOAT16); INT and UINT are not weights.
_RAW_DTYPES = {pb.FLOAT16: "<f2", pb.FLOAT: "<f4", pb.DOUBLE: "<f8"}


def _blob_values(blob: pb.BlobProto, file: Optional[str], layer: Optional[str], index: int) -> np.ndarray:
    """The flat values in Caffe's order of precedence: ``double_data`` (Caffe's Blob::FromProto
    takes it when present), ``data``, then ``raw_data`` (OpenCV's order), then the AMCT deploy
    extensions, which keep their integer type."""
    if len(blob.double_data):
        return np.asarray(blob.double_data, dtype=np.float64).astype(np.float32)
    if len(blob.data):
        return np.asarray(blob.data, dtype=np.float32)
    if blob.HasField("raw_data"):
        kind = blob.raw_data_type
        if kind not in _RAW_DTYPES:
            raise ModelError(f"blob {index} holds raw_data of type {pb.Type.Name(kind)}, not float "
                             "weights", file=file, layer=layer)
        dtype = np.dtype(_RAW_DTYPES[kind])
        if len(blob.raw_data) % dtype.itemsize:
            raise ModelError(f"blob {index}: raw_data of {len(blob.raw_data)} bytes is not a whole "
                             f"number of {pb.Type.Name(kind)} values", file=file, layer=layer)
        return np.frombuffer(blob.raw_data, dtype=dtype).astype(np.float32)
    if len(blob.int8_data):
        return np.frombuffer(blob.int8_data, dtype=np.int8).copy()
    if len(blob.int32_data):
        return np.asarray(blob.int32_data, dtype=np.int32)
    if len(blob.uint64_data):
        return np.asarray(blob.uint64_data, dtype=np.uint64)
    return np.zeros(0, np.float32)


def blob_to_array(blob: pb.BlobProto, file: Optional[str] = None, layer: Optional[str] = None,
                  index: int = 0) -> np.ndarray:
    """A BlobProto as an array of its declared shape (``blob_shape``), float32 from
    ``double_data``, ``data`` or ``raw_data`` (FLOAT16/FLOAT/DOUBLE, little-endian); a deploy
    model's AMCT blobs keep their integer type (``int8_data`` → int8, ``int32_data`` → int32,
    ``uint64_data`` → uint64) so that the layers run them with integer semantics. A value count
    that disagrees with the shape is a ModelError naming the file and layer."""
    shape = blob_shape(blob, file, layer, index)
    values = _blob_values(blob, file, layer, index)
    check_value_count(values, shape, file, layer, index)
    return values.reshape(shape)


def array_to_blob(arr: Any, blob: Optional[pb.BlobProto] = None) -> pb.BlobProto:
    """An array as a BlobProto with ``shape`` only: float → data; int8 → int8_data (bytes);
    int32 → int32_data; uint64 → uint64_data (the AMCT deploy extensions)."""
    blob = pb.BlobProto() if blob is None else blob
    a = np.asarray(arr)
    blob.shape.dim.extend(int(d) for d in a.shape)
    flat = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.int8:
        blob.int8_data = flat.tobytes()
    elif a.dtype == np.int32:
        blob.int32_data.extend(flat.tolist())
    elif a.dtype == np.uint64:
        blob.uint64_data.extend(flat.tolist())
    else:
        # ``data`` (field 5, packed float) parsed from its wire bytes: the same message as
        # ``data.extend(flat.tolist())``, 10x faster (no Python float per element)
        raw = flat.astype("<f4", copy=False).tobytes()
        blob.MergeFromString(_PACKED_DATA_TAG + varint(len(raw)) + raw)
    return blob


_PACKED_DATA_TAG = bytes([5 << 3 | 2])  # BlobProto.data: field 5, wire type 2 (length-delimited)


def _inputs(net: pb.NetParameter, layers: list[pb.LayerParameter], file: str) -> list[tuple[str, list[int]]]:
    """Net inputs from ``input`` + ``input_shape`` / ``input_dim``, then Input layers."""
    out: list[tuple[str, list[int]]] = []
    names = list(net.input)
    if names:
        if net.input_shape:
            if len(net.input_shape) != len(names):
                raise ModelError(f"{len(names)} inputs but {len(net.input_shape)} input_shape",
                                 file=file)
            out += [(n, list(s.dim)) for n, s in zip(names, net.input_shape)]
        elif net.input_dim:
            if len(net.input_dim) != 4 * len(names):
                raise ModelError(f"{len(names)} inputs need {4 * len(names)} input_dim values, "
                                 f"got {len(net.input_dim)}", file=file)
            dims = list(net.input_dim)
            out += [(n, dims[4 * i:4 * i + 4]) for i, n in enumerate(names)]
        else:
            raise ModelError("net 'input' given without input_shape or input_dim", file=file)
    elif net.input_shape or net.input_dim:
        dropped = [f.text for f in unknown_fields(net) if f.layer is None]
        why = (f"; the prototxt has {len(dropped)} field(s) this tool does not know outside any "
               f"layer, first '{dropped[0]}' (a misspelt 'input'?)" if dropped else "")
        raise ModelError(f"input_shape/input_dim given without 'input' names{why}", file=file)
    for layer in layers:
        if layer.type != "Input":
            continue
        shapes = list(layer.input_param.shape)
        if len(shapes) not in (0, 1, len(layer.top)):
            raise ModelError(f"Input layer has {len(layer.top)} tops but {len(shapes)} shapes",
                             file=file, layer=layer.name)
        for i, top in enumerate(layer.top):
            shape = [] if not shapes else list(shapes[i if len(shapes) > 1 else 0].dim)
            out.append((top, shape))
    for name, shape in out:  # declared sizes: positive, each below 2^31
        if len(shape) > MAX_BLOB_AXES:
            raise ModelError(f"input '{name}' declares {len(shape)} axes; Caffe allows at most "
                             f"{MAX_BLOB_AXES}", file=file)
        if any(d < 1 or d >= 2 ** 31 for d in shape) or int(np.prod(shape, dtype=object)) >= 2 ** 31:
            raise ModelError(f"input '{name}' declares shape {shape}: every dimension must be "
                             ">= 1 and the input below 2^31 elements", file=file)
    return out


def test_state(net: pb.NetParameter) -> pb.NetState:
    """The NetState ``caffe test`` builds a net in: phase TEST, level 0 (Caffe's Net
    constructor sets both, over the prototxt's ``state``), the prototxt's stages."""
    state = pb.NetState()
    state.CopyFrom(net.state)
    state.phase = pb.TEST
    state.level = 0
    return state


def read_net(model_file: str, weights_file: Optional[str] = None) -> ParsedNet:
    """Read a deploy, test or train_val prototxt (and optionally its caffemodel) into a
    ``ParsedNet``.

    The prototxt drives the topology (V1 upgraded, the layers of the TEST phase kept by Caffe's
    include/exclude rules); a data layer's tops become inputs; blobs are matched by layer
    name; layers only in the caffemodel are ignored. Errors name the file and the layer."""
    from amct_torch.caffe.data_layers import data_top_shapes, is_data_layer

    model_file = os.fspath(model_file)
    net = upgrade_v1(parse_prototxt(model_file), model_file)
    state = test_state(net)
    kept = [l for l in net.layer if layer_included(l, state, model_file)]
    rename_duplicates(kept)  # Caffe allows shared names; ours are distinct (duplicate_names.py)
    blobs: dict[str, list[np.ndarray]] = {}
    for layer in kept:
        if layer.blobs:
            blobs[layer.name] = [blob_to_array(b, model_file, layer.name, i)
                                 for i, b in enumerate(layer.blobs)]
    deploy = pb.NetParameter()
    deploy.CopyFrom(net)
    deploy.ClearField("layer")
    for layer in kept:
        clean = deploy.layer.add()
        clean.CopyFrom(layer)
        clean.ClearField("blobs")
    names = [l.name for l in deploy.layer]
    if weights_file is not None:
        weights_file = os.fspath(weights_file)
        blobs.update(_trained_blobs(weights_file, set(names)))
    inputs = _inputs(deploy, list(deploy.layer), model_file)
    data_layers = [l for l in deploy.layer if is_data_layer(l.type)]
    inputs += data_top_shapes(data_layers, model_file)
    layers = [l for l in deploy.layer if l.type != "Input" and not is_data_layer(l.type)]
    return ParsedNet(net=deploy, inputs=inputs, layers=layers, blobs=blobs,
                     model_file=model_file, weights_file=weights_file, data_layers=data_layers)


def _trained_blobs(weights_file: str, wanted: set[str]) -> dict[str, list[np.ndarray]]:
    """The caffemodel's blobs of the ``wanted`` layers: read layer by layer, each float blob
    straight into its array (``stream_reader``), or, for the files that reader leaves to
    protobuf (V1 layers, other value fields, anything malformed), from the whole parsed
    message. Later duplicates win, as in Caffe's CopyTrainedLayersFrom."""
    from amct_torch.caffe.stream_reader import read_weights

    check_regular_file(weights_file, "file", ModelError)  # a FIFO or device would block the read
    streamed = read_weights(weights_file, wanted)
    if streamed is not None:
        return streamed
    trained = upgrade_v1(parse_caffemodel(weights_file), weights_file)
    out: dict[str, list[np.ndarray]] = {}
    for layer in trained.layer:
        if layer.name in wanted and layer.blobs:
            out[layer.name] = [blob_to_array(b, weights_file, layer.name, i)
                               for i, b in enumerate(layer.blobs)]
    return out


def net_to_prototxt_text(net: pb.NetParameter) -> str:
    """Text prototxt of ``net`` without blobs, unknown fields put back where they were read."""
    return _ptx.to_text(_without_blobs(net))


def _without_blobs(net: pb.NetParameter) -> pb.NetParameter:
    """A copy of ``net`` whose layers have no blobs, made field by field so that the blobs
    are never copied (copying them took ~0.1 s per ResNet-50 caffemodel written)."""
    clean = pb.NetParameter()
    copy_fields(net, clean, skip=("layer", "layers"))
    for src, dst in ((net.layer, clean.layer), (net.layers, clean.layers)):
        for layer in src:
            copy_fields(layer, dst.add(), skip=("blobs",))
    return clean


def caffemodel_bytes(net: pb.NetParameter) -> bytes:
    """Serialized caffemodel: internal fields dropped, legacy blob shapes rewritten as shape.
    A net with neither is serialised as it is (no copy of its blobs)."""
    if not _needs_cleaning(net):
        return net.SerializeToString()
    return _binary(net)


def _needs_cleaning(net: pb.NetParameter) -> bool:
    if len(getattr(net, _ptx.UNKNOWN_FIELD)):
        return True
    for layer in list(net.layer) + list(net.layers):
        if len(getattr(layer, _ptx.UNKNOWN_FIELD, ())) or layer.HasField(USER_NAME):
            return True
        if any(blob.HasField(f) for blob in layer.blobs for f in LEGACY_DIMS):
            return True
    return False


def _binary(net: pb.NetParameter) -> bytes:
    """Serialized caffemodel: internal fields dropped, legacy blob shapes rewritten as shape."""
    out = pb.NetParameter()
    out.CopyFrom(net)
    _ptx.clear_unknown(out)
    for layer in list(out.layer) + list(out.layers):
        for blob in layer.blobs:
            if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
                dims = [blob.num, blob.channels, blob.height, blob.width]
                for f in ("num", "channels", "height", "width"):
                    blob.ClearField(f)
                blob.shape.Clear()
                blob.shape.dim.extend(dims)
    return out.SerializeToString()


@checked(net=instance(pb.NetParameter), prototxt_path=path_arg, caffemodel_path=opt(path_arg))
def write_net(net: pb.NetParameter, prototxt_path: str, caffemodel_path: Optional[str] = None) -> None:
    """Write ``net`` as a text prototxt (no blobs) and, if a path is given, a binary caffemodel
    (with blobs). Both contents are built before any file is touched; each file is atomic."""
    text = net_to_prototxt_text(net).encode("utf-8")
    binary = caffemodel_bytes(net) if caffemodel_path is not None else None
    atomic_write_bytes(prototxt_path, text)
    if caffemodel_path is not None and binary is not None:
        atomic_write_bytes(caffemodel_path, binary)


def _graph_layers(gm: Any) -> list[Any]:
    """The CaffeLayer modules of a graph in graph order (contract in docs/design.md)."""
    from amct_torch.caffe.layers.base import layer_modules
    return list(layer_modules(gm).values())


def graph_to_net(gm: Any) -> pb.NetParameter:
    """A NetParameter from a graph: the header, Input and data layers of ``gm.caffe_net``, then
    each layer module's ``layer_param`` with ``caffe_blobs()`` as blobs, then the metric and
    loss layers."""
    base: pb.NetParameter = gm.caffe_net
    mods = _graph_layers(gm)
    module_names = {m.layer_param.name for m in mods}
    net = pb.NetParameter()
    net.CopyFrom(base)
    net.ClearField("layer")
    data = {layer.name for layer in gm.meta.get("caffe_data_layers", [])}
    for layer in base.layer:
        if (layer.type == "Input" or layer.name in data) and layer.name not in module_names:
            net.layer.add().CopyFrom(layer)
    for mod in mods:
        layer = net.layer.add()
        layer.CopyFrom(mod.layer_param)
        layer.ClearField("blobs")
        for arr in mod.caffe_blobs():
            if hasattr(arr, "detach"):
                arr = arr.detach().cpu().numpy()
            array_to_blob(arr, layer.blobs.add())
    for head in gm.meta.get("caffe_head", []):  # a train/test net's metric and loss layers
        net.layer.add().CopyFrom(head)
    return net


@checked(gm=_graph_module, prototxt_path=path_arg, caffemodel_path=path_arg)
def save_caffe(gm: Any, prototxt_path: str, caffemodel_path: str) -> None:
    """Write a GraphModule built by ``load_caffe`` back to Caffe files (see graph_to_net)."""
    write_net(graph_to_net(gm), prototxt_path, caffemodel_path)
