"""Broken models refused at load, naming the file at fault (the prototxt for a parameter, the
caffemodel for a blob) and the layer, where before they loaded and failed later on the user's
data or ran with wrong weights: a top written by two layers (OpenCV refuses it too), an
InnerProduct weight stored (in, out), a negative BatchNorm eps or variance, SSD heads that
disagree with their PriorBox. The accepted forms are checked against OpenCV or numpy."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import parse_caffemodel, parse_prototxt, write_net
from amct_torch.errors import ModelError
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours
from helpers.ssd import ssd_net


def _refused(proto, model, layer, *words, file=None):
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    err = info.value
    assert err.layer == layer, str(err)
    if file is not None:
        assert err.file == file, str(err)
    for w in words:
        assert w in str(err), str(err)
    return err


# ------------------------------------------------------------------ two producers of one top
def test_two_layers_writing_the_same_top_are_refused_like_opencv(tmp_path):
    body = ('layer { name: "a" type: "ReLU" bottom: "data" top: "x" }\n'
            'layer { name: "b" type: "Sigmoid" bottom: "data" top: "x" }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)})
    with pytest.raises(cv2.error, match="multiple sources"):
        cv2.dnn.readNetFromCaffe(proto, model)
    _refused(proto, model, "b", "'a'", "'x'", file=proto)


def test_a_top_named_like_a_bottom_at_another_position_is_not_in_place(tmp_path):
    body = ('layer { name: "a" type: "ReLU" bottom: "data" top: "y" }\n'
            'layer { name: "e" type: "Eltwise" bottom: "data" bottom: "y" top: "y" }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)})
    with pytest.raises(cv2.error):
        cv2.dnn.readNetFromCaffe(proto, model)
    _refused(proto, model, "e", "'a'", file=proto)


def test_writing_over_a_net_input_is_refused(tmp_path):
    body = ('layer { name: "a" type: "ReLU" bottom: "data" top: "r" }\n'
            'layer { name: "b" type: "Sigmoid" bottom: "r" top: "data" }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)})
    _refused(proto, model, "b", "net input", file=proto)


def test_in_place_chains_still_load_and_match_opencv(tmp_path):
    body = ('layer { name: "a" type: "ReLU" bottom: "data" top: "data2" }\n'
            'layer { name: "b" type: "Sigmoid" bottom: "data2" top: "data2" }\n'
            'layer { name: "c" type: "TanH" bottom: "data2" top: "data2" }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)})
    x = rand(1, 3, 4, 4)
    # OpenCV names outputs by layer: the last in-place layer's
    assert_close(run_ours(proto, model, x)["data2"], run_cv(proto, model, {"data": x}, ["c"])["c"])


# ------------------------------------------------------------------ InnerProduct layout
IP = ('layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "fc" '
      'inner_product_param {{ num_output: 3 {extra} }} }}\n')


def test_inner_product_weights_stored_in_out_are_refused(tmp_path):
    w = rand(3, 8)  # (N, K) is Caffe's layout; store it transposed as (K, N)
    proto, model = make_net(tmp_path, IP.format(extra=""), {"data": (2, 8)}, {"fc": [w.T.copy(), rand(3, seed=1)]})
    _refused(proto, model, "fc", "[8, 3]", "[3, 8]", file=model)


@pytest.mark.parametrize("form", ["nk", "legacy", "transpose"])
def test_inner_product_accepted_layouts_match_numpy(tmp_path, form):
    w, b = rand(3, 8), rand(3, seed=1)
    blob = {"nk": w, "legacy": w.reshape(1, 1, 3, 8), "transpose": w.T.copy()}[form]
    extra = "transpose: true" if form == "transpose" else ""
    proto, model = make_net(tmp_path, IP.format(extra=extra), {"data": (2, 8)}, {"fc": [blob, b]},
                            legacy=form == "legacy")
    x = rand(2, 8, seed=2)
    np.testing.assert_allclose(run_ours(proto, model, x)["fc"], x @ w.T + b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ BatchNorm statistics
def _bn_net(tmp_path, mean, var, factor, eps="1e-5"):
    body = f'layer {{ name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param {{ eps: {eps} }} }}\n'
    blobs = {"bn": [np.asarray(mean, np.float32), np.asarray(var, np.float32), np.asarray([factor], np.float32)]}
    return make_net(tmp_path, body, {"data": (1, 3, 2, 2)}, blobs)


def test_negative_batchnorm_eps_names_the_prototxt(tmp_path):
    proto, model = _bn_net(tmp_path, [0, 0, 0], [1, 1, 1], 1.0, eps="-0.5")
    _refused(proto, model, "bn", "eps", file=proto)


def test_negative_batchnorm_variance_names_the_caffemodel(tmp_path):
    proto, model = _bn_net(tmp_path, [0, 0, 0], [1, -2, 1], 1.0)
    _refused(proto, model, "bn", "variance", "channel 1", file=model)


def test_negative_moving_average_factor_names_the_caffemodel(tmp_path):
    proto, model = _bn_net(tmp_path, [0, 0, 0], [1, 2, 1], -1.0)
    _refused(proto, model, "bn", "factor", file=model)


def test_zero_factor_with_zero_eps_divides_by_zero(tmp_path):
    proto, model = _bn_net(tmp_path, [1, 2, 3], [1, 2, 3], 0.0, eps="0")
    _refused(proto, model, "bn", "factor", file=model)


def test_zero_factor_with_positive_eps_runs_as_opencv_does(tmp_path):
    # Caffe and OpenCV: a factor of 0 means mean 0 and variance 0, so y = x / sqrt(eps)
    proto, model = _bn_net(tmp_path, [1, 2, 3], [1, 2, 3], 0.0, eps="0.25")
    x = rand(1, 3, 2, 2)
    ours = run_ours(proto, model, x)["bn"]
    np.testing.assert_allclose(ours, x / 0.5, rtol=1e-6)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["bn"])["bn"])


# ------------------------------------------------------------------ SSD heads vs priors
def _with_loc_channels(tmp_path, channels):
    """The SSD test net with head h1's loc convolution writing ``channels`` outputs (its
    blobs resized to match, so the convolution itself is consistent)."""
    proto, model = ssd_net(tmp_path)
    net = parse_prototxt(proto)
    trained = parse_caffemodel(model)
    for layer in net.layer:
        if layer.name == "h1_loc":
            layer.convolution_param.num_output = channels
    for layer in trained.layer:
        if layer.name == "h1_loc":
            w = rand(channels, 16, 3, 3, scale=0.1)
            for blob, arr in zip(layer.blobs, (w, np.zeros(channels, np.float32))):
                blob.Clear()
                blob.shape.dim.extend(arr.shape)
                blob.data.extend(arr.reshape(-1).tolist())
    for layer in net.layer:
        match = [t for t in trained.layer if t.name == layer.name]
        if match:
            layer.blobs.extend(match[0].blobs)
    bad_proto, bad_model = str(tmp_path / "bad.prototxt"), str(tmp_path / "bad.caffemodel")
    write_net(net, bad_proto, bad_model)
    return bad_proto, bad_model


def test_ssd_loc_head_disagreeing_with_its_priorbox_names_the_prototxt(tmp_path):
    proto, model = _with_loc_channels(tmp_path, 12)  # 3 priors' worth; the PriorBox makes 4
    err = _refused(proto, model, "detection_out", "loc", "priors", file=proto)
    assert "num_output" in str(err)


def test_ssd_net_with_matching_heads_loads(tmp_path):
    proto, model = _with_loc_channels(tmp_path, 16)
    gm = load_caffe(proto, model)
    assert "detection_out" in dict(gm.named_children())
