"""The one wire-format walker (``protowire.fields``) that the streaming caffemodel
reader, the caffemodel limits and the ONNX view share, checked against protobuf's own parser:
the spans it gives are the fields protobuf reads, in memory and read from a file alike, and
what it refuses protobuf refuses too."""
from __future__ import annotations

import io

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from amct_torch.files.protowire import LENGTH_DELIMITED, MalformedWire, fields, parts_size, read_varint
from amct_torch.proto import amct_caffe_pb2 as pb


def _net() -> pb.NetParameter:
    net = pb.NetParameter(name="n")
    net.input.append("data")
    layer = net.layer.add(name="conv", type="Convolution", phase=pb.TEST)
    layer.bottom.append("data")
    layer.convolution_param.num_output = 300  # a two-byte varint
    blob = layer.blobs.add()
    blob.shape.dim.extend([2, 3])
    blob.data.extend(np.arange(6, dtype=np.float32).tolist())
    layer.blobs.add().data.extend([1.5] * 200)  # a payload longer than 127 bytes
    net.layer.add(name="relu", type="ReLU")
    return net


def _rebuilt(data: bytes, spans) -> pb.NetParameter:
    """The message made of each span's bytes parsed on its own (protobuf merges fields)."""
    out = pb.NetParameter()
    for _, _, start, _, stop in spans:
        out.MergeFromString(data[start:stop])
    return out


def test_spans_cover_the_message_and_are_its_fields():
    net = _net()
    data = net.SerializeToString()
    spans = list(fields(data))
    assert spans[0][2] == 0 and spans[-1][4] == len(data)
    assert all(a[4] == b[2] for a, b in zip(spans, spans[1:]))  # contiguous, nothing skipped
    assert [s[0] for s in spans] == [f.number for f, v in net.ListFields()
                                     for _ in (v if f.is_repeated else [v])]
    assert _rebuilt(data, spans) == net
    layers = [s for s in spans if s[0] == 100]
    assert all(s[1] == LENGTH_DELIMITED for s in layers)
    first = pb.LayerParameter()
    first.ParseFromString(data[layers[0][3]:layers[0][4]])  # the payload bounds
    assert first == net.layer[0]


def test_a_file_read_piece_by_piece_walks_alike():
    data = _net().SerializeToString()
    f = io.BytesIO(data)

    def from_file(f: io.BytesIO, pos: int, end: int) -> tuple[int, int]:
        f.seek(pos)
        chunk = f.read(min(10, end - pos))
        value, after = read_varint(chunk, 0, len(chunk))
        return value, pos + after
    assert list(fields(f, 0, len(data), from_file)) == list(fields(data))


@pytest.mark.parametrize("bad", [
    b"\x00\x01",  # field number 0
    b"\x0b",  # a group start (wire type 3)
    b"\x0a\x05abc",  # a length past the end
    b"\x0a",  # a key with no length
    b"\x09\x01\x02",  # a fixed64 cut short
    b"\x08\x80",  # a varint cut short
])
def test_what_it_refuses_protobuf_refuses(bad):
    data = pb.NetParameter(name="ok").SerializeToString() + bad
    with pytest.raises(MalformedWire):
        list(fields(data))
    with pytest.raises(DecodeError):
        pb.NetParameter().ParseFromString(data)


def test_parts_size_counts_bytes_and_announced_sizes():
    class Source:  # a piece written later, announcing its length
        nbytes = 1000

    arr = np.zeros(7, np.float32)
    assert parts_size([b"abc", bytearray(2), arr.data.cast("B"), Source()]) == 3 + 2 + 28 + 1000
