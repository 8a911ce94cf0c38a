"""Writing a caffemodel layer by layer, never holding the whole serialised net in memory.

Why: serialising a VGG-16 net the usual way holds its weights three times (the arrays, the
``BlobProto`` copies, the file's bytes). Protobuf's wire format makes a message the concatenation
of its fields in field-number order, so the net is written as its fields before ``layer`` (100),
each layer as soon as its blobs exist (a large blob's data straight from the array's memory),
then its later fields. The bytes are exactly ``caffemodel_bytes(net)``'s (tested byte for byte);
the file goes around the page cache (``direct_io``) and into place atomically (``atomic``)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from amct_torch.caffe import prototxt as _ptx
from amct_torch.caffe.duplicate_names import restore_user_name
from amct_torch.caffe.netio import array_to_blob
from amct_torch.files.atomic import atomic_file
from amct_torch.files.direct_io import DirectFile
from amct_torch.files.protowire import copy_fields, field_key, parts_size, split_before, varint
from amct_torch.proto import amct_caffe_pb2 as pb

__all__ = ["write_caffemodel", "blob_parts", "layer_parts"]

_LAYER_FIELD = 100  # NetParameter.layer
_BLOBS_FIELD = 7  # LayerParameter.blobs
_DATA_FIELD = 5  # BlobProto.data (packed float)
_INT8_FIELD = 100  # BlobProto.int8_data (bytes)

#: arrays smaller than this are encoded by protobuf itself (one small copy, every dtype's
#: rules kept in one place: ``array_to_blob``); larger float32/int8 ones are written from
#: their own memory
DIRECT_BYTES = 1 << 16

_BLOB_FIELDS = [f.number for f in pb.BlobProto.DESCRIPTOR.fields]
_LAYER_FIELDS = [f.number for f in pb.LayerParameter.DESCRIPTOR.fields]
_NET_FIELDS = [f.number for f in pb.NetParameter.DESCRIPTOR.fields]


class _Blocks:
    """A blob's data written block by block from a source with ``blocks()`` (flat arrays in
    order, e.g. ``export.layer_quant.RowBlocks``): its size is known before any block exists."""

    def __init__(self, source, nbytes: int, little_f32: bool) -> None:
        self.source, self.nbytes, self.little_f32 = source, nbytes, little_f32

    def __iter__(self):
        for block in self.source.blocks():
            flat = np.ascontiguousarray(block).reshape(-1)
            yield (flat.astype("<f4", copy=False) if self.little_f32 else flat).data.cast("B")


def blob_parts(arr) -> list:
    """The encoding of ``array_to_blob(arr)`` as a list of buffers (a large float32 or int8
    array's data is a view of its own memory, not a copy). ``arr`` may also be a source of
    blocks (``shape``, ``dtype``, ``nbytes`` and ``blocks()``: see ``_Blocks``), whose data is
    then made as it is written; a small one is made whole."""
    blocks = hasattr(arr, "blocks") and not isinstance(arr, np.ndarray)
    a = arr if blocks else np.asarray(arr)
    direct = a.nbytes >= DIRECT_BYTES and a.ndim > 0 and (a.dtype == np.int8 or a.dtype.kind == "f")
    if not direct:
        return [array_to_blob(np.asarray(a)).SerializeToString()]
    int8 = a.dtype == np.int8
    number = _INT8_FIELD if int8 else _DATA_FIELD
    shape = pb.BlobProto()
    shape.shape.dim.extend(int(d) for d in a.shape)
    rest = shape.SerializeToString()
    cut = split_before(rest, number, _BLOB_FIELDS)
    if blocks:
        nbytes = int(a.size) * (1 if int8 else 4)  # float blobs are float32 on file
        return [rest[:cut], field_key(number) + varint(nbytes), _Blocks(a, nbytes, not int8), rest[cut:]]
    flat = np.ascontiguousarray(a).reshape(-1)
    if not int8:
        flat = flat.astype("<f4", copy=False)
    data = flat.data.cast("B")
    return [rest[:cut], field_key(number) + varint(data.nbytes), data, rest[cut:]]


def layer_parts(layer: pb.LayerParameter, arrays: Sequence[np.ndarray]) -> list:
    """The encoding of ``layer`` (whose own ``blobs`` are ignored) with ``arrays`` as its blobs,
    internal fields dropped as ``caffemodel_bytes`` drops them, as a list of buffers."""
    clean = copy_fields(layer, pb.LayerParameter(), skip=("blobs", _ptx.UNKNOWN_FIELD))
    restore_user_name(clean)
    data = clean.SerializeToString()
    cut = split_before(data, _BLOBS_FIELD, _LAYER_FIELDS)
    parts: list = [data[:cut]]
    for arr in arrays:
        blob = blob_parts(arr)
        parts.append(field_key(_BLOBS_FIELD) + varint(parts_size(blob)))
        parts += blob
    parts.append(data[cut:])
    return parts


def _net_parts(net: pb.NetParameter) -> tuple[bytes, bytes]:
    """The net's own fields before and after its ``layer`` field (layers and internal fields
    left out)."""
    if len(net.layers):
        raise ValueError("a net with V1 'layers' cannot be streamed")
    head = copy_fields(net, pb.NetParameter(), skip=("layer", _ptx.UNKNOWN_FIELD))
    data = head.SerializeToString()
    cut = split_before(data, _LAYER_FIELD, _NET_FIELDS)
    return data[:cut], data[cut:]


def _write_all(f: DirectFile, parts: Iterable) -> None:
    for p in parts:
        if isinstance(p, _Blocks):
            written = 0
            for block in p:
                written += f.write(block)
            if written != p.nbytes:  # the length prefix is already in the file
                raise ValueError(f"a blob's blocks held {written} bytes, {p.nbytes} were announced")
        else:
            f.write(p)


def _discard(f: DirectFile) -> None:
    f.close(discard=True)  # the buffers not yet written are dropped, not written


def write_caffemodel(path: str, net: pb.NetParameter,
                     layers: Iterable[tuple[pb.LayerParameter, Sequence[np.ndarray]]]) -> None:
    """Write ``path`` atomically: ``net``'s own fields with ``layers`` — (layer, its blob
    arrays) pairs, consumed one at a time — as its ``layer`` field. The file holds the bytes
    ``caffemodel_bytes`` gives for ``net`` with those layers and blobs (``net``'s own layers
    are ignored)."""
    head, tail = _net_parts(net)
    with atomic_file(path, DirectFile, discard=_discard) as f:
        f.write(head)
        for layer, arrays in layers:
            parts = layer_parts(layer, arrays)
            f.write(field_key(_LAYER_FIELD) + varint(parts_size(parts)))
            _write_all(f, parts)
            del parts
        f.write(tail)

