"""The layer-by-layer caffemodel writer gives the same bytes as serialising the whole net.

Reference: ``caffemodel_bytes`` (protobuf's ``SerializeToString`` of the net with its blobs
attached by ``array_to_blob``), and protobuf's own parser reading the streamed file back."""
from __future__ import annotations

import os

import numpy as np
import pytest
from google.protobuf import text_format

from amct_torch.caffe import prototxt as ptx
from amct_torch.caffe.netio import array_to_blob, caffemodel_bytes, parse_prototxt
from amct_torch.caffe.stream_writer import DIRECT_BYTES, write_caffemodel
from amct_torch.files.protowire import split_before
from amct_torch.proto import amct_caffe_pb2 as pb

NET = """
name: "n" input: "data" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
force_backward: true
state { phase: TEST level: 2 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" param { lr_mult: 1 }
        include { phase: TEST } convolution_param { num_output: 300 kernel_size: 3 } }
layer { name: "q" type: "Quant" bottom: "conv" top: "q" quant_param { scale: 0.5 offset: "\\375" } }
layer { name: "fc" type: "InnerProduct" bottom: "q" top: "fc" propagate_down: true
        inner_product_param { num_output: 10 } }
layer { name: "dq" type: "DeQuant" bottom: "fc" top: "fc" }
layer { name: "relu" type: "ReLU" bottom: "fc" top: "fc" }
"""


def _arrays(rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    big = DIRECT_BYTES // 4 + 17  # above the direct-write size: written from the array's memory
    return {
        "conv": [rng.standard_normal((300, 3, 3, 3)).astype(np.float32) * 1e3,
                 rng.standard_normal(300).astype(np.float32)],
        "q": [],
        "fc": [rng.integers(-128, 128, (big, 4), dtype=np.int8),
               rng.integers(-2 ** 31, 2 ** 31 - 1, 10, dtype=np.int64).astype(np.int32),
               np.zeros((0,), np.float32), np.array(3.5, np.float32),
               rng.standard_normal((big,)).astype(np.float64)],
        "dq": [rng.integers(0, 2 ** 63, 10, dtype=np.uint64)],
        "relu": [],
    }


def _whole(net: pb.NetParameter, arrays: dict) -> bytes:
    full = pb.NetParameter()
    full.CopyFrom(net)
    for layer in full.layer:
        for a in arrays.get(layer.name, []):
            array_to_blob(a, layer.blobs.add())
    return caffemodel_bytes(full)


def _stream(net: pb.NetParameter, arrays: dict, path: str) -> bytes:
    write_caffemodel(path, net, ((layer, arrays.get(layer.name, [])) for layer in net.layer))
    with open(path, "rb") as f:
        return f.read()


def test_stream_equals_whole_serialisation(tmp_path):
    net = pb.NetParameter()
    text_format.Parse(NET, net)
    arrays = _arrays(np.random.default_rng(0))
    got = _stream(net, arrays, str(tmp_path / "m.caffemodel"))
    assert got == _whole(net, arrays)
    back = pb.NetParameter()
    back.ParseFromString(got)
    assert [l.name for l in back.layer] == [l.name for l in net.layer]
    np.testing.assert_array_equal(np.frombuffer(back.layer[2].blobs[0].int8_data, np.int8),
                                  arrays["fc"][0].reshape(-1))
    np.testing.assert_array_equal(np.asarray(back.layer[0].blobs[0].data, np.float32),
                                  arrays["conv"][0].reshape(-1))
    np.testing.assert_array_equal(np.asarray(back.layer[2].blobs[4].data, np.float32),
                                  arrays["fc"][4].astype(np.float32))
    assert list(back.layer[0].blobs[0].shape.dim) == [300, 3, 3, 3]


def test_stream_drops_internal_unknown_text_like_the_whole_writer(tmp_path):
    """A prototxt field unknown to the schema is kept for the text form only: neither writer
    puts it into the binary file."""
    src = tmp_path / "u.prototxt"
    src.write_text(NET.replace("num_output: 10 }", "num_output: 10 }\n        weird_param { a: 1 }")
                   .replace('name: "n"', 'name: "n" odd_net_field: 3'))
    net = parse_prototxt(str(src))
    assert len(getattr(net, ptx.UNKNOWN_FIELD)) and len(getattr(net.layer[2], ptx.UNKNOWN_FIELD))
    arrays = _arrays(np.random.default_rng(1))
    assert _stream(net, arrays, str(tmp_path / "u.caffemodel")) == _whole(net, arrays)


def test_stream_leaves_no_file_when_a_layer_fails(tmp_path):
    net = pb.NetParameter()
    text_format.Parse(NET, net)
    path = tmp_path / "x.caffemodel"
    path.write_bytes(b"old")

    def layers():
        yield net.layer[0], [np.ones((300, 3, 3, 3), np.float32)]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_caffemodel(str(path), net, layers())
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["x.caffemodel"]


def test_split_before_orders_like_protobuf():
    layer = pb.LayerParameter(name="a", type="B", phase=pb.TEST)
    layer.bottom.append("x")
    data = layer.SerializeToString()
    cut = split_before(data, 7, [f.number for f in pb.LayerParameter.DESCRIPTOR.fields])
    layer.blobs.add().data.append(1.0)
    blob = layer.blobs[0].SerializeToString()
    assert data[:cut] + bytes([7 << 3 | 2, len(blob)]) + blob + data[cut:] == layer.SerializeToString()
