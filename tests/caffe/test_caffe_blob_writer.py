"""array_to_blob writes float blobs from their wire bytes: the message must equal the one built
element by element (protobuf's own encoder), for every length (the varint length prefix takes
1 to 4 bytes) and input dtype, and read back to the same array."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe.netio import array_to_blob, blob_to_array
from amct_torch.proto import amct_caffe_pb2 as pb


def _reference(arr: np.ndarray) -> pb.BlobProto:
    blob = pb.BlobProto()
    blob.shape.dim.extend(arr.shape)
    blob.data.extend(float(v) for v in np.ascontiguousarray(arr, dtype=np.float32).reshape(-1))
    return blob


@pytest.mark.parametrize("shape", [(0,), (1,), (31,), (32,), (33,), (4096,), (64, 3, 7, 7), (3, 2 ** 19)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_blob_equals_elementwise_encoding(shape, dtype):
    arr = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
    got = array_to_blob(arr)
    assert got.SerializeToString() == _reference(arr).SerializeToString()
    np.testing.assert_array_equal(blob_to_array(got), arr.astype(np.float32))


def test_transposed_and_special_values():
    arr = np.array([[0.0, -0.0, np.inf], [-np.inf, 1e-45, 3.4e38]], np.float32).T
    assert array_to_blob(arr).SerializeToString() == _reference(arr).SerializeToString()


def test_prototxt_parse_is_remembered_by_content_and_callers_get_copies(tmp_path, nsfw_model):
    from amct_torch.caffe.netio import parse_prototxt
    a = parse_prototxt(nsfw_model[0])
    a.layer[1].name = "changed by the caller"
    b = parse_prototxt(nsfw_model[0])
    assert b.layer[1].name != "changed by the caller"
    edited = tmp_path / "edited.prototxt"
    edited.write_text(open(nsfw_model[0]).read().replace('name: "conv_1"', 'name: "first_conv"', 1))
    c = parse_prototxt(str(edited))
    assert "first_conv" in [l.name for l in c.layer] and "conv_1" not in [l.name for l in c.layer]
    assert [l.name for l in parse_prototxt(nsfw_model[0]).layer] == [l.name for l in b.layer]


def _old_text(net):
    """The text as written before (a full copy of the net, blobs cleared)."""
    from amct_torch.caffe import prototxt as ptx
    clean = pb.NetParameter()
    clean.CopyFrom(net)
    for layer in list(clean.layer) + list(clean.layers):
        layer.ClearField("blobs")
    return ptx.to_text(clean)


def test_text_and_binary_without_copying_blobs_equal_the_copying_way(tmp_path):
    """Unknown fields (kept from a fork's prototxt), V1 layers, legacy blob shapes: the text and
    the caffemodel bytes are what the full-copy way gave."""
    from amct_torch.caffe.netio import _binary, caffemodel_bytes, net_to_prototxt_text, parse_prototxt
    from amct_torch.workflow.examples import example_model

    text = open(example_model()[0]).read().replace("convolution_param {", "my_fork_param { level: 3 }\n  convolution_param {", 1)
    path = tmp_path / "fork.prototxt"
    path.write_text(text)
    net = parse_prototxt(str(path))
    assert "my_fork_param" in net_to_prototxt_text(net)
    for i, layer in enumerate(net.layer[:4]):
        array_to_blob(np.arange(6, dtype=np.float32).reshape(2, 3) + i, layer.blobs.add())
    legacy = net.layer[1].blobs.add()
    legacy.num, legacy.channels, legacy.height, legacy.width = 1, 1, 2, 2
    legacy.data.extend([1.0, 2.0, 3.0, 4.0])
    v1 = net.layers.add()
    v1.name = "old_style"
    v1.bottom.append("data")
    v1.blobs.add().data.extend([5.0])
    assert net_to_prototxt_text(net) == _old_text(net)
    assert caffemodel_bytes(net) == _binary(net)
    plain = pb.NetParameter()
    plain.layer.add().name = "conv"
    array_to_blob(np.ones((2, 2), np.float32), plain.layer[0].blobs.add())
    assert caffemodel_bytes(plain) == _binary(plain) == plain.SerializeToString()
