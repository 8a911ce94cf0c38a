"""Weight formats of real caffemodels: OpenCV's half-precision blobs (``raw_data_type: FLOAT16``
with the bytes in ``raw_data``, as ``cv2.dnn.shrinkCaffeModel`` writes them), FLOAT raw_data,
``double_data`` taking precedence over ``data`` (Caffe's Blob::FromProto), Caffe's limit of 32
axes, and integer (deploy) blobs where float weights belong. References: OpenCV's importer
reading the same shrunk file, numpy's IEEE half rounding, hand-written values."""
from __future__ import annotations

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.layers.base import layer_modules
from amct_torch.caffe.netio import blob_to_array, parse_caffemodel
from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.workflow.examples import EXAMPLE_DIR, example_data
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

MODEL = os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt")
WEIGHTS = os.path.join(EXAMPLE_DIR, "lenet_digits.caffemodel")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("shrunk") / "lenet_fp16.caffemodel")
    cv2.dnn.shrinkCaffeModel(WEIGHTS, path)
    return path


def test_shrunk_model_really_holds_float16_raw_data(shrunk):
    net = parse_caffemodel(shrunk)
    conv1 = next(l for l in net.layer if l.name == "conv1")
    assert conv1.blobs[0].raw_data_type == pb.FLOAT16 and len(conv1.blobs[0].data) == 0
    assert len(conv1.blobs[0].raw_data) == 2 * 16 * 1 * 3 * 3


def test_float16_weights_are_the_fp16_rounding_of_the_originals(shrunk):
    orig = layer_modules(load_caffe(MODEL, WEIGHTS))
    half = layer_modules(load_caffe(MODEL, shrunk))
    compared = 0
    for name, mod in half.items():
        for got, want in zip(mod.caffe_blobs(), orig[name].caffe_blobs()):
            ref = np.asarray(want, np.float32)
            if name.startswith(("conv", "fc")):  # shrinkCaffeModel halves Convolution and IP
                ref = ref.astype(np.float16).astype(np.float32)
                compared += 1
            np.testing.assert_array_equal(np.asarray(got), ref)
    assert compared == 10  # 3 conv + 2 IP, weights and biases


def test_shrunk_model_output_matches_opencv_reading_it(shrunk):
    x, _ = example_data("calib")
    x = np.ascontiguousarray(x[:4], np.float32)
    ours = run_ours(MODEL, shrunk, x)["prob"]
    ref = run_cv(MODEL, shrunk, {"data": x}, ["prob"])["prob"]
    assert_close(ours, ref, 1e-4)


def test_calibrate_onnx_job_on_the_shrunk_model_writes_float_caffe_weights(shrunk, tmp_path):
    x, _ = example_data("calib")
    data = str(tmp_path / "calib.npz")
    np.savez(data, inputs=x[:32])
    out = str(tmp_path / "out" / "m")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "amct_torch.cli", "calibrate", MODEL, shrunk, data,
                          "--device", "cpu", "--onnx", "--batch-num", "2", "-o", out, "-q"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert os.path.isfile(out + "_quant.onnx")
    fake = parse_caffemodel(out + "_fake_quant_weights.caffemodel")
    conv1 = next(l for l in fake.layer if l.name == "conv1")
    # our Caffe outputs always hold float32 ``data`` (any Caffe reads it), never raw_data
    assert len(conv1.blobs[0].data) == 144 and not conv1.blobs[0].HasField("raw_data")


def _blob(shape, **fields) -> pb.BlobProto:
    b = pb.BlobProto()
    b.shape.dim.extend(shape)
    for k, v in fields.items():
        if isinstance(v, (bytes, int)):
            setattr(b, k, v)
        else:
            getattr(b, k).extend(v)
    return b


def test_float_raw_data_little_endian():
    vals = np.array([1.5, -2.25, 3e-3, 7.0], "<f4")
    b = _blob([2, 2], raw_data_type=pb.FLOAT, raw_data=vals.tobytes())
    np.testing.assert_array_equal(blob_to_array(b), vals.reshape(2, 2))


def test_float16_raw_data_hand_values():
    # 0x3C00 = 1.0, 0xC000 = -2.0, 0x3555 = 0.333251953125 (IEEE half)
    raw = bytes([0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35])
    b = _blob([3], raw_data_type=pb.FLOAT16, raw_data=raw)
    np.testing.assert_array_equal(blob_to_array(b), np.array([1.0, -2.0, 0.333251953125], np.float32))


def test_raw_data_of_the_wrong_length_or_an_integer_type_is_refused():
    with pytest.raises(ModelError, match="3 values but shape"):
        blob_to_array(_blob([2, 2], raw_data_type=pb.FLOAT16, raw_data=b"\0" * 6), "w.caffemodel", "c")
    with pytest.raises(ModelError, match="whole number"):
        blob_to_array(_blob([2], raw_data_type=pb.FLOAT, raw_data=b"\0" * 5), "w.caffemodel", "c")
    with pytest.raises(ModelError, match="type INT"):
        blob_to_array(_blob([1], raw_data_type=pb.INT, raw_data=b"\0" * 4), "w.caffemodel", "c")


def test_double_data_wins_over_data_as_in_caffe():
    b = _blob([2], data=[1.0, 2.0], double_data=[5.0, 6.0])
    np.testing.assert_array_equal(blob_to_array(b), np.array([5.0, 6.0], np.float32))


def test_blob_with_100_axes_is_a_model_error():
    with pytest.raises(ModelError) as info:
        blob_to_array(_blob([1] * 100, data=[1.0]), "w.caffemodel", "conv1")
    assert "100 axes" in str(info.value) and "32" in str(info.value)
    assert info.value.file == "w.caffemodel" and info.value.layer == "conv1"
    np.testing.assert_array_equal(blob_to_array(_blob([1] * 32, data=[4.0])).reshape(-1), [4.0])


CONV = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
        'convolution_param { num_output: 2 kernel_size: 1 } }\n')


def _with_blob(proto_model, layer, index, edit) -> str:
    proto, model = proto_model
    net = parse_caffemodel(model)
    blob = next(l for l in net.layer if l.name == layer).blobs[index]
    edit(blob)
    with open(model, "wb") as f:
        f.write(net.SerializeToString())
    return model


def test_int32_only_weights_are_refused_as_a_deploy_model(tmp_path):
    w = rand(2, 3, 1, 1)
    proto, model = make_net(tmp_path, CONV, {"data": (1, 3, 4, 4)}, {"conv": [w, rand(2, seed=1)]})

    def to_int32(b):
        b.ClearField("data")
        b.int32_data.extend([7] * 6)
    _with_blob((proto, model), "conv", 0, to_int32)
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    assert info.value.file == model and info.value.layer == "conv"
    assert "int32_data" in str(info.value) and "deploy model" in str(info.value)


def test_the_data_and_double_data_blob_runs_with_the_double_values(tmp_path):
    w = rand(2, 3, 1, 1)
    proto, model = make_net(tmp_path, CONV, {"data": (1, 3, 4, 4)}, {"conv": [w, np.zeros(2, np.float32)]})
    w2 = 2.0 * w
    _with_blob((proto, model), "conv", 0, lambda b: b.double_data.extend(w2.reshape(-1).tolist()))
    x = rand(1, 3, 4, 4, seed=3)
    ours = run_ours(proto, model, x)["conv"]
    ref = np.einsum("oc,nchw->nohw", w2.reshape(2, 3), x)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_input_with_more_than_32_axes_is_refused(tmp_path):
    relu = 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }'
    proto, model = make_net(tmp_path, relu, {"data": [1] * 33}, {}, name="axes33")
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    assert info.value.file == proto and "33 axes" in str(info.value)
    proto, model = make_net(tmp_path, relu, {"data": [1] * 32}, {}, name="axes32")
    assert load_caffe(proto, model).caffe_inputs[0][1] == [1] * 32


def test_real_nsfw_model_shrunk_to_fp16_matches_opencv(nsfw_model, tmp_path):
    """The real ResNet-50-1by2 halved by OpenCV's shrinker: every Convolution/InnerProduct blob
    is the fp16 rounding of the original, and the class probabilities match OpenCV's reading of
    the shrunk file."""
    from helpers.data import natural_images_bgr
    proto, weights = nsfw_model
    shrunk = str(tmp_path / "nsfw_fp16.caffemodel")
    cv2.dnn.shrinkCaffeModel(weights, shrunk)
    orig = layer_modules(load_caffe(proto, weights))
    half = load_caffe(proto, shrunk)
    halved = 0
    for name, mod in layer_modules(half).items():
        if mod.caffe_type in ("Convolution", "InnerProduct"):
            for got, want in zip(mod.caffe_blobs(), orig[name].caffe_blobs()):
                np.testing.assert_array_equal(got, np.asarray(want).astype(np.float16).astype(np.float32))
                halved += 1
    assert halved > 50
    x = natural_images_bgr(224, 2)
    ref = run_cv(proto, shrunk, {"data": x}, ["prob"])["prob"]
    assert_close(run_ours(proto, shrunk, x)["prob"], ref, 1e-4)
