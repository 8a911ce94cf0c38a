"""The Caffe model forms read_net understands: V1 nets, three input forms, legacy and shape
blobs, double_data, TEST-phase filtering."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe import netio
from amct_torch.proto import amct_caffe_pb2 as pb

V1 = pb.V1LayerParameter


def _save(tmp_path, net, name="m"):
    """Write a NetParameter built in a test as prototxt (no blobs) + binary (all of it), using
    protobuf directly so the files do not depend on our writer."""
    from google.protobuf import text_format
    text_net = pb.NetParameter()
    text_net.CopyFrom(net)
    for l in list(text_net.layer) + list(text_net.layers):
        l.ClearField("blobs")
    proto = tmp_path / f"{name}.prototxt"
    proto.write_text(text_format.MessageToString(text_net))
    weights = tmp_path / f"{name}.caffemodel"
    weights.write_bytes(net.SerializeToString())
    return str(proto), str(weights)


def _legacy_blob(blob, dims, values):
    blob.num, blob.channels, blob.height, blob.width = dims
    blob.data.extend(values)


def test_v1_net_upgrade(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    fc_w = rng.standard_normal((5, 4)).astype(np.float32)
    net = pb.NetParameter(name="v1")
    net.input.append("data")
    net.input_dim.extend([1, 3, 8, 8])
    data = net.layers.add(name="mnist", type=V1.DATA, top=["data", "label"])
    data.include.add(phase=pb.TRAIN)
    data.data_param.source = "train_lmdb"
    conv = net.layers.add(name="conv1", type=V1.CONVOLUTION, bottom=["data"], top=["conv1"])
    conv.blobs_lr.extend([1.0, 2.0])
    conv.weight_decay.extend([1.0, 0.0])
    conv.param.extend(["w_shared", "b_shared"])
    conv.convolution_param.num_output = 4
    conv.convolution_param.kernel_size.append(3)
    conv.convolution_param.pad.append(1)
    _legacy_blob(conv.blobs.add(), (4, 3, 3, 3), w.ravel().tolist())
    _legacy_blob(conv.blobs.add(), (1, 1, 1, 4), b.tolist())
    net.layers.add(name="relu1", type=V1.RELU, bottom=["conv1"], top=["conv1"]).relu_param.negative_slope = 0.1
    pool = net.layers.add(name="pool1", type=V1.POOLING, bottom=["conv1"], top=["pool1"])
    pool.pooling_param.pool = pb.PoolingParameter.AVE
    pool.pooling_param.global_pooling = True
    fc = net.layers.add(name="fc", type=V1.INNER_PRODUCT, bottom=["pool1"], top=["fc"])
    fc.inner_product_param.num_output = 5
    _legacy_blob(fc.blobs.add(), (1, 1, 5, 4), fc_w.ravel().tolist())  # right-aligned legacy
    net.layers.add(name="prob", type=V1.SOFTMAX, bottom=["fc"], top=["prob"])
    net.layers.add(name="loss", type=V1.SOFTMAX_LOSS, bottom=["fc", "label"], top=["loss"]).include.add(phase=pb.TRAIN)
    proto, weights = _save(tmp_path, net, "v1")

    parsed = netio.read_net(proto, weights)
    assert not parsed.net.layers
    assert [(l.name, l.type) for l in parsed.layers] == [
        ("conv1", "Convolution"), ("relu1", "ReLU"), ("pool1", "Pooling"),
        ("fc", "InnerProduct"), ("prob", "Softmax")]
    conv_new = parsed.layers[0]
    assert [(p.name, p.lr_mult, p.decay_mult) for p in conv_new.param] == [
        ("w_shared", 1.0, 1.0), ("b_shared", 2.0, 0.0)]
    assert list(conv_new.convolution_param.kernel_size) == [3]
    assert list(conv_new.convolution_param.pad) == [1]
    assert parsed.layers[1].relu_param.negative_slope == pytest.approx(0.1)
    assert parsed.layers[2].pooling_param.pool == pb.PoolingParameter.AVE
    assert parsed.inputs == [("data", [1, 3, 8, 8])]
    np.testing.assert_array_equal(parsed.blobs["conv1"][0], w)
    assert parsed.blobs["conv1"][1].shape == (1, 1, 1, 4)
    np.testing.assert_array_equal(parsed.blobs["conv1"][1].ravel(), b)
    assert parsed.blobs["fc"][0].shape == (1, 1, 5, 4)
    np.testing.assert_array_equal(parsed.blobs["fc"][0].reshape(5, 4), fc_w)
    assert set(parsed.blobs) == {"conv1", "fc"}


def _tiny(head: str) -> str:
    return head + 'layer { name: "r" type: "ReLU" bottom: "a" top: "r" }\n'


@pytest.mark.parametrize("head, expected", [
    ('input: "a"\ninput_dim: 2\ninput_dim: 3\ninput_dim: 4\ninput_dim: 5\n'
     'input: "b"\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\ninput_dim: 7\n',
     [("a", [2, 3, 4, 5]), ("b", [1, 1, 1, 7])]),
    ('input: "a"\ninput_shape { dim: 2 dim: 3 }\ninput: "b"\ninput_shape { dim: 9 }\n',
     [("a", [2, 3]), ("b", [9])]),
    ('layer { name: "in" type: "Input" top: "a" top: "b"\n'
     '  input_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } shape { dim: 1 dim: 2 } } }\n',
     [("a", [1, 3, 4, 4]), ("b", [1, 2])]),
    ('layer { name: "in" type: "Input" top: "a" top: "b"\n'
     '  input_param { shape { dim: 1 dim: 3 } } }\n',
     [("a", [1, 3]), ("b", [1, 3])]),
])
def test_three_input_forms(tmp_path, head, expected):
    path = tmp_path / "in.prototxt"
    path.write_text(_tiny(head))
    parsed = netio.read_net(str(path))
    assert parsed.inputs == expected
    assert [l.name for l in parsed.layers] == ["r"]  # Input layers are not in .layers


def test_shape_blobs_and_double_data(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((2, 3)).astype(np.float64)
    net = pb.NetParameter()
    net.input.append("a")
    net.input_shape.add(dim=[1, 3])
    fc = net.layer.add(name="fc", type="InnerProduct", bottom=["a"], top=["fc"])
    fc.inner_product_param.num_output = 2
    blob = fc.blobs.add()
    blob.shape.dim.extend([2, 3])
    blob.double_data.extend(w.ravel().tolist())
    scalar = fc.blobs.add()  # empty shape, one value: a scalar
    scalar.data.append(4.5)
    # a layer only in the caffemodel is ignored
    net.layer.add(name="extra", type="ReLU").blobs.add(data=[1.0])
    proto, weights = _save(tmp_path, net)
    text = (tmp_path / "m.prototxt").read_text()
    (tmp_path / "m.prototxt").write_text(text.replace('layer {\n  name: "extra"\n  type: "ReLU"\n}\n', ""))
    parsed = netio.read_net(proto, weights)
    assert parsed.blobs["fc"][0].dtype == np.float32
    np.testing.assert_array_equal(parsed.blobs["fc"][0], w.astype(np.float32))
    assert parsed.blobs["fc"][1].shape == () and float(parsed.blobs["fc"][1]) == 4.5
    assert "extra" not in parsed.blobs
    assert not any(l.blobs for l in parsed.net.layer)  # blobs live in .blobs only


PHASES = """name: "p"
input: "a"
input_shape { dim: 1 dim: 2 }
layer { name: "train_only" type: "ReLU" bottom: "a" top: "t" include { phase: TRAIN } }
layer { name: "test_only" type: "ReLU" bottom: "a" top: "u" include { phase: TEST } }
layer { name: "not_test" type: "ReLU" bottom: "a" top: "v" exclude { phase: TEST } }
layer { name: "not_train" type: "ReLU" bottom: "a" top: "w" exclude { phase: TRAIN } }
layer { name: "always" type: "ReLU" bottom: "a" top: "x" }
layer { name: "staged" type: "ReLU" bottom: "a" top: "y" include { stage: "deploy" } }
layer { name: "leveled" type: "ReLU" bottom: "a" top: "z" include { phase: TEST min_level: 2 } }
"""


def test_phase_rules(tmp_path):
    path = tmp_path / "p.prototxt"
    path.write_text(PHASES)
    names = [l.name for l in netio.read_net(str(path)).layers]
    assert names == ["test_only", "not_train", "always"]
    # the net's own stages are honoured; the phase is always TEST and the level 0, as Caffe's
    # Net(file, TEST) constructor (caffe test, pycaffe) sets them over the prototxt's state
    path.write_text(PHASES + 'state { phase: TRAIN level: 3 stage: "deploy" }\n')
    names = [l.name for l in netio.read_net(str(path)).layers]
    assert names == ["test_only", "not_train", "always", "staged"]
