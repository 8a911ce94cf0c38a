"""The layer-by-layer caffemodel reader gives the arrays protobuf's whole-message parse gives,
and leaves every file it does not handle to that parser (None).

Reference: ``NetParameter.ParseFromString`` of the same bytes and ``blob_to_array``."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe.netio import array_to_blob, blob_to_array, read_net
from amct_torch.caffe.stream_reader import read_weights
from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb


def _net(rng: np.random.Generator) -> pb.NetParameter:
    net = pb.NetParameter(name="n")
    for name, shapes in (("conv", [(8, 3, 3, 3), (8,)]), ("relu", []), ("big", [(300, 2000), (300,)]),
                         ("other", [(4,)])):
        layer = net.layer.add(name=name, type="X")
        layer.bottom.append("a")
        layer.phase = pb.TEST
        for s in shapes:
            array_to_blob(rng.standard_normal(s).astype(np.float32), layer.blobs.add())
    return net


def _reference(data: bytes, wanted: set[str]) -> dict[str, list[np.ndarray]]:
    net = pb.NetParameter()
    net.ParseFromString(data)
    out = {}
    for layer in net.layer:
        if layer.name in wanted and layer.blobs:
            out[layer.name] = [blob_to_array(b, "f", layer.name, i) for i, b in enumerate(layer.blobs)]
    return out


def _same(got, want):
    assert got is not None and list(got) == list(want)
    for k in want:
        assert len(got[k]) == len(want[k])
        for a, b in zip(got[k], want[k]):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_reads_what_protobuf_parses(tmp_path):
    net = _net(np.random.default_rng(0))
    # a later duplicate wins; gradients (diff) are skipped; legacy 4-D dims give the shape
    dup = net.layer.add(name="conv", type="X")
    for s in [(8, 3, 3, 3), (8,)]:
        b = dup.blobs.add()
        b.num, b.channels, b.height, b.width = (list(s) + [1, 1, 1])[:4] if len(s) == 4 else (1, 1, 1, s[0])
        b.data.extend(np.arange(int(np.prod(s)), dtype=np.float32).tolist())
        b.diff.extend([1.0, 2.0])
    data = net.SerializeToString()
    path = tmp_path / "m.caffemodel"
    path.write_bytes(data)
    wanted = {"conv", "big", "relu"}
    _same(read_weights(str(path), wanted), _reference(data, wanted))


@pytest.mark.parametrize("case", ["v1", "double", "raw", "unpacked", "truncated", "empty", "int8", "no_layers"])
def test_leaves_other_files_to_the_parser(tmp_path, case):
    net = _net(np.random.default_rng(1))
    if case == "v1":
        v1 = net.layers.add(name="old")
        v1.blobs.add().data.extend([1.0])
    elif case == "double":
        net.layer[0].blobs[1].double_data.extend([1.0] * 8)
    elif case == "raw":
        net.layer[3].blobs[0].ClearField("data")
        net.layer[3].blobs[0].raw_data_type = pb.FLOAT16
        net.layer[3].blobs[0].raw_data = np.ones(4, "<f2").tobytes()
    elif case == "int8":
        net.layer[3].blobs[0].int8_data = b"\x01\x02\x03\x04"
    elif case == "no_layers":
        net.ClearField("layer")
    data = net.SerializeToString()
    if case == "unpacked":  # BlobProto.data written element by element (wire type 5)
        blob = pb.BlobProto()
        blob.shape.dim.append(2)
        raw = blob.SerializeToString() + b"".join(bytes([5 << 3 | 5]) + np.float32(v).tobytes() for v in (1, 2))
        layer = pb.LayerParameter(name="u").SerializeToString() + bytes([7 << 3 | 2, len(raw)]) + raw
        data += bytes([0xA2, 0x06, len(layer)]) + layer
    if case == "truncated":
        data = data[:-100]
    if case == "empty":
        data = b""
    path = tmp_path / "m.caffemodel"
    path.write_bytes(data)
    assert read_weights(str(path), {"conv", "big", "other", "old", "u"}) is None


def test_count_mismatch_is_the_parsers_error(tmp_path):
    net = pb.NetParameter()
    layer = net.layer.add(name="conv1", type="Convolution")
    b = layer.blobs.add()
    b.shape.dim.extend([2, 3])
    b.data.extend([1.0] * 5)
    (tmp_path / "w.caffemodel").write_bytes(net.SerializeToString())
    (tmp_path / "m.prototxt").write_text('input: "data" input_shape { dim: 1 dim: 3 }\n'
                                         'layer { name: "conv1" type: "InnerProduct" bottom: "data" top: "c" '
                                         'inner_product_param { num_output: 2 } }\n')
    assert read_weights(str(tmp_path / "w.caffemodel"), {"conv1"}) is None
    with pytest.raises(ModelError, match="blob 0 has 5 values but shape"):
        read_net(str(tmp_path / "m.prototxt"), str(tmp_path / "w.caffemodel"))
