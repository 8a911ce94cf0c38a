"""Reading and writing back loses nothing: unknown fields (binary and text), the real nsfw
model byte for byte, and what we write loads in OpenCV's Caffe importer with identical output."""
from __future__ import annotations

import os
import re

import cv2
import numpy as np
import pytest
from google.protobuf import text_format

from amct_torch.caffe import netio
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_nets import run_cv
from helpers.data import natural_images_bgr


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def test_binary_unknown_fields_survive(tmp_path):
    layer = pb.LayerParameter(name="fc", type="InnerProduct", bottom=["a"], top=["fc"])
    blob = layer.blobs.add(data=[1.0, 2.0])
    blob.shape.dim.append(2)
    # a fork's fields, unknown to our schema: a varint 7777 and a message 8888 on the layer
    extra = _field(7777, 0, _varint(42)) + _field(8888, 2, _varint(3) + b"xyz")
    layer_bytes = layer.SerializeToString() + extra
    data = _field(1, 2, _varint(1) + b"n") + _field(100, 2, _varint(len(layer_bytes)) + layer_bytes)
    src = tmp_path / "in.caffemodel"
    src.write_bytes(data)
    net = netio.parse_caffemodel(str(src))
    netio.write_net(net, str(tmp_path / "out.prototxt"), str(tmp_path / "out.caffemodel"))
    assert (tmp_path / "out.caffemodel").read_bytes() == data


FORK = """name: "fork"
fork_net_option: 3
input: "a"
input_shape { dim: 1 dim: 2 dim: 4 dim: 4 }
layer {
  name: "conv"
  type: "Convolution"
  bottom: "a"
  top: "conv"
  fork_layer_flag: true
  param { lr_mult: 1 }
  param { lr_mult: 2 fork_param_tag: 5 }
  convolution_param {
    num_output: 2
    kernel_size: 1
    fork_conv_mode: 7
    fork_nested { deeper: 1 deeper2: 2 }
  }
  fork_block { x: 1.5 y: -2 }
}
layer {
  name: "relu" type: "ReLU" bottom: "conv" top: "conv"
  relu_param { negative_slope: 0.25 }
}
"""


def _block(text: str, opener: str) -> str:
    """The lines of the first block opened by ``opener`` (test helper, brace counting)."""
    start = text.index(opener)
    if "{" not in opener:  # a layer's name: start at the "layer {" before it
        start = text.rindex("layer {", 0, start)
    depth, i = 0, start
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1


def test_text_unknown_fields_load_and_survive(tmp_path):
    src = tmp_path / "fork.prototxt"
    src.write_text(FORK)
    parsed = netio.read_net(str(src))
    conv = parsed.layers[0]
    assert conv.type == "Convolution" and conv.convolution_param.num_output == 2
    assert [p.lr_mult for p in conv.param] == [1.0, 2.0]
    assert parsed.layers[1].relu_param.negative_slope == 0.25

    netio.write_net(parsed.net, str(tmp_path / "out.prototxt"))
    out = (tmp_path / "out.prototxt").read_text()
    # each unknown field is back inside the block it was read from
    conv_block = _block(out, 'name: "conv"')
    assert "fork_layer_flag: true" in conv_block
    assert re.search(r"fork_block \{\s*x: 1.5 y: -2\s*\}", conv_block)
    cp = _block(conv_block, "convolution_param {")
    assert "fork_conv_mode: 7" in cp and re.search(r"fork_nested \{\s*deeper: 1 deeper2: 2\s*\}", cp)
    second_param = _block(conv_block[conv_block.index("lr_mult: 2") - 40:], "param {")
    assert "fork_param_tag: 5" in second_param and "lr_mult: 2" in second_param
    assert "fork_net_option: 3" in out and "fork_net_option" not in conv_block
    assert "fork" not in _block(out, 'name: "relu"')
    # reading the written file gives the same net again (semantic round trip)
    again = netio.read_net(str(tmp_path / "out.prototxt"))
    assert again.net == parsed.net
    # and without the unknown entries it is what plain protobuf reads skipping unknown fields
    clean = pb.NetParameter()
    clean.CopyFrom(again.net)
    clean.ClearField("amct_unknown_text")
    for l in clean.layer:
        l.ClearField("amct_unknown_text")
    lenient = pb.NetParameter()
    text_format.Parse(FORK, lenient, allow_unknown_field=True)
    assert clean == lenient


def test_unknown_fields_never_reach_caffemodel(tmp_path):
    src = tmp_path / "fork.prototxt"
    src.write_text(FORK)
    net = netio.parse_prototxt(str(src))
    netio.write_net(net, str(tmp_path / "o.prototxt"), str(tmp_path / "o.caffemodel"))
    binary = pb.NetParameter()
    binary.ParseFromString((tmp_path / "o.caffemodel").read_bytes())
    assert not binary.amct_unknown_text and not any(l.amct_unknown_text for l in binary.layer)
    assert b"fork_" not in (tmp_path / "o.caffemodel").read_bytes()


def test_nsfw_caffemodel_bytes_identical(tmp_path, nsfw_model):
    proto, weights = nsfw_model
    net = netio.parse_caffemodel(weights)
    netio.write_net(net, str(tmp_path / "w.prototxt"), str(tmp_path / "w.caffemodel"))
    assert (tmp_path / "w.caffemodel").read_bytes() == open(weights, "rb").read()


def test_nsfw_prototxt_semantic_round_trip(tmp_path, nsfw_model):
    proto, _ = nsfw_model
    net = netio.parse_prototxt(proto)
    netio.write_net(net, str(tmp_path / "d.prototxt"))
    reference = text_format.Parse(open(proto).read(), pb.NetParameter())  # plain protobuf
    assert netio.parse_prototxt(str(tmp_path / "d.prototxt")) == reference


def test_rewritten_nsfw_runs_identically_in_opencv(tmp_path, nsfw_model):
    proto, weights = nsfw_model
    parsed = netio.read_net(proto, weights)
    net = pb.NetParameter()
    net.CopyFrom(parsed.net)
    for layer in net.layer:
        for arr in parsed.blobs.get(layer.name, []):
            netio.array_to_blob(arr, layer.blobs.add())
    out_proto, out_weights = str(tmp_path / "r.prototxt"), str(tmp_path / "r.caffemodel")
    netio.write_net(net, out_proto, out_weights)
    written = pb.NetParameter()
    written.ParseFromString(open(out_weights, "rb").read())
    assert all(not b.HasField("num") and len(b.shape.dim) for l in written.layer for b in l.blobs)
    x = natural_images_bgr(count=2)
    ref = run_cv(proto, weights, {"data": x}, ["prob"])["prob"]
    got = run_cv(out_proto, out_weights, {"data": x}, ["prob"])["prob"]
    assert ref.shape == (2, 2)
    np.testing.assert_array_equal(got, ref)


QUANT_NET = """name: "q"
input: "data"
input_dim: 1 input_dim: 1 input_dim: 2 input_dim: 2
layer { name: "r" type: "ReLU" bottom: "data" top: "r" %s }
"""


def test_opencv_tolerance_of_amct_quant_fields(tmp_path):
    """Facts the exporter relies on (docs/caffe_format.md): OpenCV's text parser keeps unknown
    fields and turns them into layer params; numeric values pass, a string/bytes value (such as
    AMCT's one-byte ``offset``) makes the import fail."""
    x = np.array([[[[-1.0, 2.0], [3.0, -4.0]]]], np.float32)
    path = tmp_path / "q.prototxt"
    path.write_text(QUANT_NET % "quant_param { scale: 0.5 offset: -3 }")
    net = cv2.dnn.readNetFromCaffe(str(path))
    net.setInput(x)
    np.testing.assert_array_equal(net.forward(), np.maximum(x, 0))
    # the bytes form written by protobuf text format for QuantParameter.offset
    layer = pb.LayerParameter()
    layer.quant_param.scale = 0.5
    layer.quant_param.offset = bytes([256 - 3])
    path.write_text(QUANT_NET % text_format.MessageToString(layer.quant_param, as_one_line=True)
                    .join(["quant_param { ", " }"]))
    with pytest.raises(cv2.error):
        cv2.dnn.readNetFromCaffe(str(path))


def test_opencv_ignores_amct_blob_extensions_in_caffemodel(tmp_path):
    """A caffemodel whose blobs also carry int8/int32/uint64 data and whose layer carries
    quant_param (binary, field 5001) still loads in OpenCV and gives the float result."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 1, 1, 1)).astype(np.float32)
    text = ('name: "c"\ninput: "data"\ninput_dim: 1 input_dim: 1 input_dim: 2 input_dim: 2\n'
            'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"\n'
            '  convolution_param { num_output: 2 kernel_size: 1 bias_term: false } }\n')
    (tmp_path / "c.prototxt").write_text(text)
    net = pb.NetParameter()
    layer = net.layer.add(name="conv", type="Convolution")
    blob = netio.array_to_blob(w, layer.blobs.add())
    blob.int8_data = bytes([1, 255])
    blob.int32_data.extend([-5, 7])
    blob.uint64_data.extend([(1 << 40) | 123])
    layer.quant_param.scale = 2.0
    layer.quant_param.offset = b"\xfd"
    (tmp_path / "c.caffemodel").write_bytes(net.SerializeToString())
    x = rng.standard_normal((1, 1, 2, 2)).astype(np.float32)
    got = run_cv(str(tmp_path / "c.prototxt"), str(tmp_path / "c.caffemodel"), {"data": x}, ["conv"])["conv"]
    np.testing.assert_allclose(got, w.reshape(1, 2, 1, 1) * x, rtol=1e-6)


def test_write_is_atomic(tmp_path, nsfw_model, monkeypatch):
    proto, _ = nsfw_model
    net = netio.parse_prototxt(proto)
    target = tmp_path / "keep.prototxt"
    target.write_text("old")
    with pytest.raises(OSError):
        netio.write_net(net, str(tmp_path / "missing_dir" / "x.prototxt"))
    before = sorted(os.listdir(tmp_path))

    class Boom(Exception):
        pass

    def boom(_net):
        raise Boom()  # the caffemodel fails to serialise, after the prototxt text was made

    monkeypatch.setattr(netio, "caffemodel_bytes", boom)
    with pytest.raises(Boom):
        netio.write_net(net, str(target), str(tmp_path / "keep.caffemodel"))
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == before  # no temp files, no half-written model
