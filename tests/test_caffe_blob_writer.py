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
