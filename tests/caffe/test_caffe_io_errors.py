"""Bad Caffe files are ModelErrors that name the file (and line or layer)."""
from __future__ import annotations

import pytest

from amct_torch.caffe import netio
from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb

GOOD = """name: "n"
layer {
  name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 2 } }
}
layer {
  name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
  inner_product_param { num_output: 3 }
}
"""


def _write(tmp_path, name, content):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(p)


def test_syntax_error_names_file_and_line(tmp_path):
    bad = GOOD.splitlines()
    bad[7] = '  inner_product_param { num_output: }'  # line 8: a value is missing
    path = _write(tmp_path, "bad.prototxt", "\n".join(bad) + "\n")
    with pytest.raises(ModelError) as info:
        netio.parse_prototxt(path)
    assert info.value.file == path and info.value.line == 8
    assert f"{path}:8" in str(info.value)


def test_syntax_error_line_exact_after_unknown_fields(tmp_path):
    # unknown fields are cut out before parsing; the reported line must still be the real one
    lines = GOOD.splitlines()
    lines[3] = '  fork_thing { a: 1\n b: "x" }\n  input_param { shape { dim: 1 dim: 2 } }'
    lines[7] = '  inner_product_param { num_output: 3 bogus_value: 7 } }}'
    text = "\n".join(lines) + "\n"
    path = _write(tmp_path, "bad.prototxt", text)
    with pytest.raises(ModelError) as info:
        netio.parse_prototxt(path)
    expected = text.splitlines().index('  inner_product_param { num_output: 3 bogus_value: 7 } }}') + 1
    assert info.value.line == expected


@pytest.mark.parametrize("content", ["", "   \n# only a comment\n"])
def test_empty_prototxt(tmp_path, content):
    path = _write(tmp_path, "e.prototxt", content)
    with pytest.raises(ModelError, match="empty") as info:
        netio.parse_prototxt(path)
    assert info.value.file == path


def test_missing_file_is_model_error(tmp_path):
    with pytest.raises(ModelError) as info:
        netio.parse_prototxt(str(tmp_path / "nope.prototxt"))
    assert "nope.prototxt" in str(info.value)


def test_empty_caffemodel(tmp_path):
    path = _write(tmp_path, "e.caffemodel", b"")
    with pytest.raises(ModelError, match="empty") as info:
        netio.parse_caffemodel(path)
    assert info.value.file == path


def test_truncated_caffemodel(tmp_path, nsfw_model):
    data = open(nsfw_model[1], "rb").read()
    for cut in (len(data) // 2, len(data) - 1, 100):
        path = _write(tmp_path, f"t{cut}.caffemodel", data[:cut])
        with pytest.raises(ModelError) as info:
            netio.parse_caffemodel(path)
        assert info.value.file == path


@pytest.mark.parametrize("content", [b"\xff\xff\xff\xff\xff\xff", b"\x0a\x05ab", b"name: \"not binary\"\n"])
def test_corrupt_caffemodel(tmp_path, content):
    path = _write(tmp_path, "c.caffemodel", content)
    with pytest.raises(ModelError) as info:
        netio.parse_caffemodel(path)
    assert info.value.file == path


def test_blob_count_mismatch_names_layer(tmp_path):
    proto = _write(tmp_path, "m.prototxt", GOOD)
    net = pb.NetParameter()
    layer = net.layer.add(name="fc", type="InnerProduct")
    blob = layer.blobs.add()
    blob.shape.dim.extend([3, 2])
    blob.data.extend([1.0] * 5)  # 5 values for a 3x2 shape
    weights = _write(tmp_path, "m.caffemodel", net.SerializeToString())
    with pytest.raises(ModelError) as info:
        netio.read_net(proto, weights)
    assert info.value.file == weights and info.value.layer == "fc"


def test_input_dim_count_mismatch(tmp_path):
    path = _write(tmp_path, "i.prototxt", 'input: "a"\ninput_dim: 1\ninput_dim: 3\n'
                  'layer { name: "r" type: "ReLU" bottom: "a" top: "r" }\n')
    with pytest.raises(ModelError, match="input_dim") as info:
        netio.read_net(path)
    assert info.value.file == path


def test_v1_unknown_type_names_layer():
    net = pb.NetParameter()
    net.layers.add(name="odd", type=pb.V1LayerParameter.NONE)
    with pytest.raises(ModelError) as info:
        netio.upgrade_v1(net, "x.prototxt")
    assert info.value.layer == "odd"


def test_duplicate_layer_names(tmp_path):
    """Shared names load as in Caffe (the earlier layer renamed inside, the user's name kept);
    the quantized InnerProduct sharing its name is refused naming file and layer."""
    from amct_torch.caffe.duplicate_names import refuse_quantized_duplicates, user_name
    fc_again = 'layer { name: "fc" type: "ReLU" bottom: "fc" top: "fc" }\n'
    path = _write(tmp_path, "d.prototxt", GOOD + fc_again)
    layers = netio.read_net(path).net.layer
    assert [l.name for l in layers] == ["data", "fc#1", "fc"]
    assert [user_name(l) for l in layers] == ["data", "fc", "fc"]
    with pytest.raises(ModelError) as info:
        refuse_quantized_duplicates(layers, ["fc#1"], path)
    assert info.value.layer == "fc" and info.value.file == path
