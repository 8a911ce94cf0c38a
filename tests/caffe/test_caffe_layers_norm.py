"""BatchNorm, Scale, Bias, LRN and Normalize against OpenCV and numpy references."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours


@pytest.mark.parametrize("factor", [0.5, 1.0, 0.0])
def test_batchnorm_scale_factor(tmp_path, factor, device):
    """Blobs are mean*s, var*s, s; s == 0 makes mean and var 0 (Caffe's rule)."""
    body = 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param { eps: 0.001 } }'
    mean, var = rand(4, seed=1), np.abs(rand(4, seed=2)) + 0.1
    blobs = [mean * factor, var * factor, np.array([factor], np.float32)]
    proto, model = make_net(tmp_path, body, {"data": (2, 4, 3, 5)}, {"bn": blobs})
    x = rand(2, 4, 3, 5, seed=3)
    ours = run_ours(proto, model, x, device=device)["bn"]
    m, v = (mean, var) if factor else (np.zeros(4), np.zeros(4))
    ref = (x - m.reshape(1, -1, 1, 1)) / np.sqrt(v.reshape(1, -1, 1, 1) + 0.001)
    assert_close(ours, ref, 1e-5)
    if factor:
        assert_close(ours, run_cv(proto, model, {"data": x}, ["bn"])["bn"], 1e-5)


def test_batchnorm_in_place_then_scale_matches_opencv(tmp_path):
    body = ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "data" }\n'
            'layer { name: "sc" type: "Scale" bottom: "data" top: "data" scale_param { bias_term: true } }')
    blobs = {"bn": [rand(3, seed=1) * 7, np.abs(rand(3, seed=2)) * 7 + 1, np.array([7.0], np.float32)],
             "sc": [rand(3, seed=3), rand(3, seed=4)]}
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 4, 4)}, blobs)
    x = rand(2, 3, 4, 4, seed=5)
    ours = run_ours(proto, model, x)
    assert list(ours) == ["data"]
    assert_close(ours["data"], run_cv(proto, model, {"data": x}, ["sc"])["sc"], 1e-5)


@pytest.mark.parametrize("params,pshape,bias", [
    ("", (3,), False),
    ("bias_term: true", (3,), True),
    ("axis: 1 num_axes: 2 bias_term: true", (3, 4), True),
    ("axis: 2 num_axes: -1", (4, 5), False),
    ("axis: 0 num_axes: 0", (), False),
])
def test_scale_single_bottom(tmp_path, params, pshape, bias, device):
    body = f'layer {{ name: "sc" type: "Scale" bottom: "data" top: "sc" scale_param {{ {params} }} }}'
    g = rand(*pshape, seed=1) if pshape else np.array(1.7, np.float32)
    b = rand(*pshape, seed=2) if pshape else np.array(0.3, np.float32)
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 4, 5)}, {"sc": [g, b] if bias else [g]})
    x = rand(2, 3, 4, 5, seed=3)
    ours = run_ours(proto, model, x, device=device)["sc"]
    axis = int(params.split("axis: ")[1].split()[0]) if "axis" in params else 1
    view = (1,) * axis + pshape + (1,) * (4 - axis - len(pshape))
    ref = x * g.reshape(view) + (b.reshape(view) if bias else 0)
    assert_close(ours, ref, 1e-6)
    if params in ("", "bias_term: true"):
        assert_close(ours, run_cv(proto, model, {"data": x}, ["sc"])["sc"], 1e-6)


@pytest.mark.parametrize("axis,bias", [(0, True), (1, False)])
def test_scale_with_two_bottoms(tmp_path, axis, bias, device):
    """The second bottom is gamma, spanning input axes [axis, axis + its rank); bias is the blob."""
    body = ('layer { name: "sc" type: "Scale" bottom: "data" bottom: "gamma" top: "sc" '
            f'scale_param {{ axis: {axis} bias_term: {str(bias).lower()} }} }}')
    gshape = (2, 3) if axis == 0 else (3,)
    b = rand(*gshape, seed=2)
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 4, 5), "gamma": gshape}, {"sc": [b] if bias else []})
    x, g = rand(2, 3, 4, 5, seed=3), rand(*gshape, seed=4)
    ours = run_ours(proto, model, x, g, device=device)["sc"]
    view = (2, 3, 1, 1) if axis == 0 else (1, 3, 1, 1)
    assert_close(ours, x * g.reshape(view) + (b.reshape(view) if bias else 0), 1e-6)
    if axis == 1:  # OpenCV follows Caffe's two-bottom Scale only for the default axis, no bias
        assert_close(ours, run_cv(proto, model, {"data": x, "gamma": g}, ["sc"])["sc"], 1e-6)


def test_bias_blob_and_two_bottoms(tmp_path):
    body = ('layer { name: "b1" type: "Bias" bottom: "data" top: "b1" }\n'
            'layer { name: "b2" type: "Bias" bottom: "b1" bottom: "other" top: "b2" bias_param { axis: 2 } }')
    bb = rand(3, seed=1)
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 4, 5), "other": (4, 5)}, {"b1": [bb]})
    x, o = rand(2, 3, 4, 5, seed=2), rand(4, 5, seed=3)
    ours = run_ours(proto, model, x, o)["b2"]
    assert_close(ours, x + bb[None, :, None, None] + o[None, None], 1e-6)


def lrn_reference(x, n, alpha, beta, k, within):
    """Caffe LRN written out: across channels (sum over n channels centred on c, zero-padded)
    or within a channel (Caffe AVE pooling n x n, pad (n-1)/2, divisor n*n, then 1 + alpha*avg)."""
    x = x.astype(np.float64)
    _, c, h, w = x.shape
    pre = (n - 1) // 2
    sq = x * x
    if not within:
        pad = np.pad(sq, ((0, 0), (pre, n - 1 - pre), (0, 0), (0, 0)))
        s = sum(pad[:, i:i + c] for i in range(n))
        return x * (k + alpha / n * s) ** -beta
    pad = np.pad(sq, ((0, 0), (0, 0), (pre, pre), (pre, pre)))
    s = sum(pad[:, :, i:i + h, j:j + w] for i in range(n) for j in range(n))
    return x * (1 + alpha * s / (n * n)) ** -beta


@pytest.mark.parametrize("region,n,k", [("ACROSS_CHANNELS", 5, 2.0), ("ACROSS_CHANNELS", 3, 1.0),
                                        ("WITHIN_CHANNEL", 3, 2.0), ("WITHIN_CHANNEL", 5, 1.0)])
def test_lrn(tmp_path, region, n, k, device):
    body = (f'layer {{ name: "lrn" type: "LRN" bottom: "data" top: "lrn" lrn_param {{ local_size: {n} '
            f'alpha: 0.3 beta: 0.75 k: {k} norm_region: {region} }} }}')
    proto, model = make_net(tmp_path, body, {"data": (2, 7, 6, 5)})
    x = rand(2, 7, 6, 5, seed=1, scale=2)
    ours = run_ours(proto, model, x, device=device)["lrn"]
    assert_close(ours, lrn_reference(x, n, 0.3, 0.75, k, region == "WITHIN_CHANNEL"), 1e-5)
    if k == 1.0:  # OpenCV ignores Caffe's k (it reads its own "bias" field)
        assert_close(ours, run_cv(proto, model, {"data": x}, ["lrn"])["lrn"], 1e-5)


@pytest.mark.parametrize("across,shared", [(True, True), (False, True), (False, False), (True, False)])
def test_normalize(tmp_path, across, shared, device):
    body = (f'layer {{ name: "norm" type: "Normalize" bottom: "data" top: "norm" norm_param {{ '
            f'across_spatial: {str(across).lower()} channel_shared: {str(shared).lower()} eps: 1e-6 }} }}')
    s = np.abs(rand(1 if shared else 4, seed=1)) + 1
    proto, model = make_net(tmp_path, body, {"data": (2, 4, 3, 5)}, {"norm": [s]})
    x = rand(2, 4, 3, 5, seed=2)
    ours = run_ours(proto, model, x, device=device)["norm"]
    axes = (1, 2, 3) if across else (1,)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).sum(axis=axes, keepdims=True) + 1e-6) * s.reshape(1, -1, 1, 1)
    assert_close(ours, ref, 1e-5)
    if shared or not across:  # OpenCV refuses a per-channel scale with across_spatial
        assert_close(ours, run_cv(proto, model, {"data": x}, ["norm"])["norm"], 1e-5)
