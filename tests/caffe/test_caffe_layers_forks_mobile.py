"""The mobile / YOLO / SegNet forks' layer types on nets built by code: ConvolutionDepthwise,
DepthwiseConvolution, ShuffleChannel, ReLU6, HardSwish, HardSigmoid, Axpy, Upsample (nearest and
SegNet's unpooling), the MAX Pooling mask top and the forks' BN.

References: OpenCV's Caffe importer where it implements the type with the fork's parameters
(ConvolutionDepthwise, ShuffleChannel, ReLU6 defaults, HardSwish, HardSigmoid, Axpy), otherwise
a numpy reference written here from the fork's C++ loops (DepthwiseConvolution, which OpenCV
does not know; ReLU6 with a slope/threshold, which OpenCV ignores; nearest Upsample; the pooling
mask; SegNet's unpooling; BN). Odd spatial sizes throughout, batch 2.
"""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import read_net, save_caffe
from amct_torch.errors import ModelError
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

SHAPE = [2, 6, 9, 11]


def _np_depthwise(x, w, b, stride, pad, dil):
    """Caffe's depthwise loop: out[n,c,h,w] = sum_k w[c,k] * x[n,c,h*s-p+k*d] (outside = 0)."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[-2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), np.float64)
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    out = np.zeros((n, c, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            out += patch * w[:, 0, i, j].reshape(1, c, 1, 1)
    if b is not None:
        out += b.reshape(1, c, 1, 1)
    return out


# (id, convolution_param text, kernel, stride, pad, dilation, bias)
DW_CASES = [
    ("k3_p1_s1", "kernel_size: 3 pad: 1", (3, 3), (1, 1), (1, 1), (1, 1), True),
    ("k3_p1_s2", "kernel_size: 3 pad: 1 stride: 2", (3, 3), (2, 2), (1, 1), (1, 1), True),
    ("k3x5_hw", "kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2 stride_h: 2 stride_w: 1 bias_term: false", (3, 5), (2, 1), (1, 2), (1, 1), False),
    ("k3_dil2", "kernel_size: 3 pad: 2 dilation: 2 bias_term: false", (3, 3), (1, 1), (2, 2), (2, 2), False),
    ("k5_nopad_s3", "kernel_size: 5 stride: 3", (5, 5), (3, 3), (0, 0), (1, 1), True),
]


@pytest.mark.parametrize("kind,group,seed,cv", [
    ("ConvolutionDepthwise", "", 1, True),
    # OpenCV has no DepthwiseConvolution; the fork's CPU forward is Caffe's grouped conv
    ("DepthwiseConvolution", "group: 6 ", 4, False),
], ids=["ConvolutionDepthwise", "DepthwiseConvolution"])
@pytest.mark.parametrize("case", DW_CASES, ids=[c[0] for c in DW_CASES])
def test_depthwise_types_match_numpy_and_opencv(tmp_path, kind, group, seed, cv, case):
    _, param, k, s, p, d, bias = case
    w = rand(6, 1, *k, seed=seed) * 0.5
    b = rand(6, seed=seed + 1) if bias else None
    body = (f'layer {{ name: "t" type: "{kind}" bottom: "data" top: "t" '
            f'convolution_param {{ num_output: 6 {group}{param} }} }}')
    proto, model = make_net(tmp_path, body, {"data": SHAPE}, {"t": [w] + ([b] if bias else [])})
    x = rand(*SHAPE, seed=seed + 2)
    ours = run_ours(proto, model, x)["t"]
    assert_close(ours, _np_depthwise(x, w, b, s, p, d))
    if cv:
        assert_close(ours, run_cv(proto, model, {"data": x}, ["t"])["t"])


def test_depthwise_convolution_with_group_2_is_a_grouped_convolution(tmp_path):
    """group is the user's (here 2 groups of 3 channels, 4 outputs): Convolution's result."""
    w, b = rand(4, 3, 3, 3, seed=7) * 0.3, rand(4, seed=8)
    body = ('layer { name: "t" type: "DepthwiseConvolution" bottom: "data" top: "t" '
            'convolution_param { num_output: 4 group: 2 kernel_size: 3 } }')
    proto, model = make_net(tmp_path, body, {"data": SHAPE}, {"t": [w, b]})
    ref_body = body.replace("DepthwiseConvolution", "Convolution")
    rproto, rmodel = make_net(tmp_path, ref_body, {"data": SHAPE}, {"t": [w, b]}, name="ref")
    x = rand(*SHAPE, seed=9)
    assert_close(run_ours(proto, model, x)["t"], run_cv(rproto, rmodel, {"data": x}, ["t"])["t"])


def test_convolution_depthwise_without_num_output_and_without_weights(tmp_path):
    body = ('layer { name: "t" type: "ConvolutionDepthwise" bottom: "data" top: "t" '
            'convolution_param { kernel_size: 3 stride: 2 } }')
    proto, _ = make_net(tmp_path, body, {"data": SHAPE})
    gm = load_caffe(proto)
    mod = gm.get_submodule("t")
    assert tuple(mod.weight.shape) == (6, 1, 3, 3) and mod.groups == 6


@pytest.mark.parametrize("body, blobs, match", [
    ('layer { name: "t" type: "ConvolutionDepthwise" bottom: "data" top: "t" convolution_param { num_output: 12 kernel_size: 3 } }',
     {"t": [rand(6, 1, 3, 3), rand(6)]}, "num_output 12 differs from the 6 input channels"),
    ('layer { name: "t" type: "ConvolutionDepthwise" bottom: "data" top: "t" convolution_param { num_output: 6 kernel_size: 3 } }',
     {"t": [rand(6, 2, 3, 3), rand(6)]}, "weight blob"),
    ('layer { name: "t" type: "DepthwiseConvolution" bottom: "data" top: "t" convolution_param { num_output: 6 group: 4 kernel_size: 3 } }',
     {"t": [rand(6, 1, 3, 3), rand(6)]}, "not divisible by group"),
])
def test_depthwise_bad_parameters_name_the_file_and_layer(tmp_path, body, blobs, match):
    proto, model = make_net(tmp_path, body, {"data": SHAPE}, blobs)
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert ("net.prototxt" in str(err.value) or "net.caffemodel" in str(err.value)) and "'t'" in str(err.value)


# -- ShuffleChannel ----------------------------------------------------------------------------
@pytest.mark.parametrize("group, shape", [(3, [2, 6, 9, 11]), (2, [2, 6, 5, 7]), (4, [2, 12, 3, 5]),
                                          (1, [2, 6, 9, 11]), (6, [2, 6, 1, 1])])
def test_shuffle_channel_matches_opencv(tmp_path, group, shape):
    body = f'layer {{ name: "t" type: "ShuffleChannel" bottom: "data" top: "t" shuffle_channel_param {{ group: {group} }} }}'
    proto, model = make_net(tmp_path, body, {"data": shape})
    x = rand(*shape, seed=group)
    ours = run_ours(proto, model, x)["t"]
    np.testing.assert_array_equal(ours, run_cv(proto, model, {"data": x}, ["t"])["t"].reshape(ours.shape))
    c = shape[1]  # the fork's loop: input channel i * (c / g) + j goes to output j * g + i
    ref = np.empty_like(x)
    for i in range(group):
        for j in range(c // group):
            ref[:, j * group + i] = x[:, i * (c // group) + j]
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("group, match", [(4, "not divisible by group 4"), (0, "group must be > 0")])
def test_shuffle_channel_bad_group(tmp_path, group, match):
    body = f'layer {{ name: "t" type: "ShuffleChannel" bottom: "data" top: "t" shuffle_channel_param {{ group: {group} }} }}'
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert "net.prototxt" in str(err.value) and "'t'" in str(err.value)


# -- activations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    'layer { name: "t" type: "ReLU6" bottom: "data" top: "t" }',
    'layer { name: "t" type: "HardSwish" bottom: "data" top: "t" }',
    'layer { name: "t" type: "HardSigmoid" bottom: "data" top: "t" }',
    'layer { name: "t" type: "HardSigmoid" bottom: "data" top: "t" hardsigmoid_param { alpha: 0.3 beta: 0.4 } }',
], ids=["relu6", "hardswish", "hardsigmoid", "hardsigmoid_params"])
def test_activations_match_opencv(tmp_path, body):
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    x = rand(*SHAPE, seed=11, scale=5.0)
    assert_close(run_ours(proto, model, x)["t"], run_cv(proto, model, {"data": x}, ["t"])["t"], tol=1e-6)


def _np_relu6(x, slope, thr):
    return np.minimum(np.maximum(x, 0) + slope * np.minimum(x, 0), thr)


def _np_hard_swish(x):
    return x * np.minimum(np.maximum(x / 6.0 + 0.5, 0.0), 1.0)


def _np_hard_sigmoid(x, a, b):
    return np.maximum(0.0, np.minimum(1.0, x * a + b))


@pytest.mark.parametrize("param, ref", [
    ("", lambda x: _np_relu6(x, 0.0, 6.0)),
    ("relu6_param { negative_slope: 0.1 }", lambda x: _np_relu6(x, 0.1, 6.0)),
    ("relu6_param { threshold: 1.5 negative_slope: 0.25 }", lambda x: _np_relu6(x, 0.25, 1.5)),
    ("relu6_param { threshold: 3 }", lambda x: _np_relu6(x, 0.0, 3.0)),
])
def test_relu6_parameters_match_numpy(tmp_path, param, ref):
    """OpenCV's ReLU6 ignores the forks' relu6_param: numpy from the fork's loop."""
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "ReLU6" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE})
    x = rand(*SHAPE, seed=12, scale=5.0)
    assert_close(run_ours(proto, model, x)["t"], ref(x.astype(np.float64)), tol=1e-6)


def test_hard_swish_and_sigmoid_match_numpy(tmp_path):
    """A negative alpha too (OpenCV drops the sign of negative custom params)."""
    body = ('layer { name: "a" type: "HardSwish" bottom: "data" top: "a" }\n'
            'layer { name: "b" type: "HardSigmoid" bottom: "data" top: "b" hardsigmoid_param { alpha: 0.5 beta: 0.25 } }\n'
            'layer { name: "c" type: "HardSigmoid" bottom: "data" top: "c" hardsigmoid_param { alpha: -0.125 beta: 0.75 } }')
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    x = rand(*SHAPE, seed=13, scale=6.0)
    out = run_ours(proto, model, x)
    assert_close(out["a"], _np_hard_swish(x.astype(np.float64)), tol=1e-6)
    assert_close(out["b"], _np_hard_sigmoid(x.astype(np.float64), 0.5, 0.25), tol=1e-6)
    assert_close(out["c"], _np_hard_sigmoid(x.astype(np.float64), -0.125, 0.75), tol=1e-6)


# -- Axpy ------------------------------------------------------------------------------------------
AXPY_NET = ('layer {{ name: "a" type: "Pooling" bottom: "data" top: "a" pooling_param {{ pool: AVE global_pooling: true }} }}\n'
            'layer {{ name: "s" type: "Sigmoid" bottom: "a" top: "s" }}\n{flat}'
            'layer {{ name: "y" type: "Power" bottom: "data" top: "y" power_param {{ scale: -0.5 shift: 1 }} }}\n'
            'layer {{ name: "t" type: "Axpy" bottom: "{scale}" bottom: "data" bottom: "y" top: "t" }}')


@pytest.mark.parametrize("shape", [[2, 6, 9, 11], [2, 3, 1, 7]])
def test_axpy_matches_numpy(tmp_path, shape):
    """The fork (SENet): top = bottom[2] + a * bottom[1]. Not checked against OpenCV: its
    importer (4.14) computes a * bottom[2] + bottom[1] (the fork's x and y swapped)."""
    proto, model = make_net(tmp_path, AXPY_NET.format(flat="", scale="s"), {"data": shape})
    x = rand(*shape, seed=14)
    a = 1 / (1 + np.exp(-x.astype(np.float64).mean(axis=(2, 3), keepdims=True)))
    assert_close(run_ours(proto, model, x)["t"], a * x + (1 - 0.5 * x))


def test_axpy_three_inputs_matches_numpy(tmp_path):
    body = 'layer { name: "t" type: "Axpy" bottom: "a" bottom: "x" bottom: "y" top: "t" }'
    proto, model = make_net(tmp_path, body, {"a": [2, 6, 1, 1], "x": SHAPE, "y": SHAPE})
    a, x, y = rand(2, 6, 1, 1, seed=1), rand(*SHAPE, seed=2), rand(*SHAPE, seed=3)
    ref = a.astype(np.float64) * x + y
    assert_close(run_ours(proto, model, a, x, y)["t"], ref)
    assert np.abs(ref - (a.astype(np.float64) * y + x)).max() > 0.1  # the two orders differ here


def test_axpy_with_a_2d_scale_matches_numpy(tmp_path):
    flat = 'layer { name: "f" type: "Flatten" bottom: "s" top: "f" }\n'
    proto, model = make_net(tmp_path, AXPY_NET.format(flat=flat, scale="f"), {"data": SHAPE})
    x = rand(*SHAPE, seed=15)
    a = 1 / (1 + np.exp(-x.astype(np.float64).mean(axis=(2, 3), keepdims=True)))
    assert_close(run_ours(proto, model, x)["t"], a * x + (1 - 0.5 * x))


@pytest.mark.parametrize("bottoms, match", [
    ('bottom: "data" bottom: "data" bottom: "data"', "must be 1 x 1"),
    ('bottom: "b" bottom: "data" bottom: "data"', "must have the \\(num, channels\\)"),
    ('bottom: "a" bottom: "data" bottom: "p"', "differ in shape"),
])
def test_axpy_bad_shapes(tmp_path, bottoms, match):
    body = ('layer { name: "a" type: "Pooling" bottom: "data" top: "a" pooling_param { pool: AVE global_pooling: true } }\n'
            'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            f'layer {{ name: "t" type: "Axpy" {bottoms} top: "t" }}')
    proto, model = make_net(tmp_path, body, {"data": SHAPE, "b": [2, 4, 1, 1]})
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert "'t'" in str(err.value)


# -- nearest Upsample (darknet2caffe) --------------------------------------------------------------
@pytest.mark.parametrize("param, s", [("upsample_param { scale: 2 }", 2), ("upsample_param { scale: 3 }", 3),
                                      ("", 1), ("upsample_param { scale: 1 }", 1)])
def test_nearest_upsample_matches_numpy(tmp_path, param, s):
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "Upsample" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE})
    x = rand(*SHAPE, seed=16)
    ours = run_ours(proto, model, x)["t"]
    ref = np.empty((2, 6, 9 * s, 11 * s), np.float32)
    for h in range(9 * s):  # the fork's loop: out[h, w] = in[h / s, w / s]
        for w in range(11 * s):
            ref[:, :, h, w] = x[:, :, h // s, w // s]
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("param, match", [
    ("upsample_param { scale: 0 }", "scale must be >= 1"),
    ("upsample_param { scale: 2 upsample_h: 10 upsample_w: 10 }", "take.* a second bottom"),
    ("upsample_param { pad_out_h: true }", "second bottom"),
])
def test_nearest_upsample_bad_parameters(tmp_path, param, match):
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "Upsample" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE})
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert "net.prototxt" in str(err.value) and "'t'" in str(err.value)


# -- MAX Pooling mask + SegNet unpooling -----------------------------------------------------------
def _np_pool_mask(x, k, s, p, out_hw):
    """Caffe's PoolingLayer MAX loop: the window clipped to the input, first maximum wins."""
    n, c, h, w = x.shape
    oh, ow = out_hw
    top = np.full((n, c, oh, ow), -np.finfo(np.float32).max, np.float32)
    mask = np.full((n, c, oh, ow), -1.0, np.float32)
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h), min(ws + k[1], w)
            hs, ws = max(hs, 0), max(ws, 0)
            for hh in range(hs, he):
                for ww in range(ws, we):
                    better = x[:, :, hh, ww] > top[:, :, i, j]
                    top[:, :, i, j] = np.where(better, x[:, :, hh, ww], top[:, :, i, j])
                    mask[:, :, i, j] = np.where(better, hh * w + ww, mask[:, :, i, j])
    return top, mask


def _np_unpool(x, mask, out_hw):
    """SegNet's Upsample loop: zeros, then top[mask[i]] = x[i] in order."""
    n, c = x.shape[:2]
    out = np.zeros((n, c, out_hw[0] * out_hw[1]), np.float32)
    xf, mf = x.reshape(n, c, -1), mask.reshape(n, c, -1).astype(np.int64)
    for a in range(n):
        for b in range(c):
            for i in range(xf.shape[-1]):
                out[a, b, mf[a, b, i]] = xf[a, b, i]
    return out.reshape(n, c, *out_hw)


# (id, pooling_param, kernel, stride, pad, input (H, W), upsample_param, unpooled (H, W))
UNPOOL_CASES = [
    ("k2s2_even", "kernel_size: 2 stride: 2", (2, 2), (2, 2), (0, 0), (8, 10), "scale: 2", (8, 10)),
    ("k2s2_odd_pad_out", "kernel_size: 2 stride: 2", (2, 2), (2, 2), (0, 0), (9, 11),
     "scale: 2 pad_out_h: true pad_out_w: true", (9, 11)),
    ("k2s2_odd_explicit", "kernel_size: 2 stride: 2", (2, 2), (2, 2), (0, 0), (9, 11),
     "upsample_h: 9 upsample_w: 11", (9, 11)),
    ("k2s2_default_scale", "kernel_size: 2 stride: 2", (2, 2), (2, 2), (0, 0), (8, 6), "", (8, 6)),
    ("k3s3_scale_hw", "kernel_size: 3 stride: 3", (3, 3), (3, 3), (0, 0), (9, 12), "scale_h: 3 scale_w: 3", (9, 12)),
    ("k3s2_overlap_pad", "kernel_size: 3 stride: 2 pad: 1", (3, 3), (2, 2), (1, 1), (9, 11),
     "upsample_h: 9 upsample_w: 11", (9, 11)),
]


@pytest.mark.parametrize("case", UNPOOL_CASES, ids=[c[0] for c in UNPOOL_CASES])
def test_pool_mask_and_segnet_unpooling_match_numpy(tmp_path, case):
    _, pool, k, s, p, hw, up, out_hw = case
    shape = [2, 3, *hw]
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param {{ pool: MAX {pool} }} }}\n'
            'layer { name: "keep" type: "Power" bottom: "mask" top: "mask_out" }\n'
            'layer { name: "keep2" type: "Power" bottom: "pool" top: "pool_out" }\n'
            f'layer {{ name: "t" type: "Upsample" bottom: "pool" bottom: "mask" top: "t" upsample_param {{ {up} }} }}')
    proto, model = make_net(tmp_path, body, {"data": shape})
    x = rand(*shape, seed=17)
    x[0, 0, 0, :3] = 1.5  # ties: the first maximum in raster order wins
    out = run_ours(proto, model, x)
    ph, pw = out["pool_out"].shape[-2:]
    top, mask = _np_pool_mask(x, k, s, p, (ph, pw))
    np.testing.assert_array_equal(out["pool_out"], top)
    np.testing.assert_array_equal(out["mask_out"], mask)
    np.testing.assert_array_equal(out["t"], _np_unpool(top, mask, out_hw))


def test_global_max_pool_mask(tmp_path):
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param { pool: MAX global_pooling: true } }\n'
            'layer { name: "keep" type: "Power" bottom: "mask" top: "mask_out" }')
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    x = rand(*SHAPE, seed=18)
    out = run_ours(proto, model, x)
    flat = x.reshape(2, 6, -1)
    np.testing.assert_array_equal(out["pool"].reshape(2, 6), flat.max(-1))
    np.testing.assert_array_equal(out["mask_out"].reshape(2, 6), flat.argmax(-1).astype(np.float32))


@pytest.mark.parametrize("pool, up, match", [
    ("pool: AVE kernel_size: 2 stride: 2", "scale: 2", "only MAX pooling has a second top"),
    ("pool: MAX kernel_size: 2 stride: 2", "scale: 3 pad_out_h: true", "pad_out_h needs scale_h 2"),
    ("pool: MAX kernel_size: 2 stride: 2", "scale: 2 scale_h: 2 scale_w: 2", "not both"),
    ("pool: MAX kernel_size: 2 stride: 2", "scale: 1", "scale must be > 1"),
    ("pool: MAX kernel_size: 2 stride: 2", "upsample_h: 8", "upsample_h and upsample_w must be given together"),
])
def test_segnet_upsample_bad_parameters(tmp_path, pool, up, match):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param {{ {pool} }} }}\n'
            f'layer {{ name: "t" type: "Upsample" bottom: "pool" bottom: "mask" top: "t" upsample_param {{ {up} }} }}')
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert "net.prototxt" in str(err.value)


def test_segnet_upsample_mask_shape_must_match(tmp_path):
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            'layer { name: "t" type: "Upsample" bottom: "pool" bottom: "data" top: "t" upsample_param { scale: 2 } }')
    proto, model = make_net(tmp_path, body, {"data": SHAPE})
    with pytest.raises(ModelError, match="the mask .* must have the shape of the input") as err:
        load_caffe(proto, model)
    assert "'t'" in str(err.value)


# -- BN (SegNet, PSPNet) -----------------------------------------------------------------------------
def test_segnet_bn_inference_matches_numpy(tmp_path):
    sc, sh = rand(1, 6, 1, 1, seed=19), rand(1, 6, 1, 1, seed=20)
    body = 'layer { name: "t" type: "BN" bottom: "data" top: "t" bn_param { bn_mode: INFERENCE } }'
    proto, model = make_net(tmp_path, body, {"data": SHAPE}, {"t": [sc, sh]})
    x = rand(*SHAPE, seed=21)
    assert_close(run_ours(proto, model, x)["t"], sc * x.astype(np.float64) + sh)


@pytest.mark.parametrize("param", ["", "bn_param { bn_mode: LEARN }"])
def test_segnet_bn_learn_uses_the_batch_statistics(tmp_path, param):
    sc, sh = rand(1, 6, 1, 1, seed=22), rand(1, 6, 1, 1, seed=23)
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "BN" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE}, {"t": [sc, sh]})
    x = rand(*SHAPE, seed=24) * 3 + 1
    xd = x.astype(np.float64)
    mean = xd.mean(axis=(0, 2, 3), keepdims=True)
    var = (xd * xd).mean(axis=(0, 2, 3), keepdims=True) - mean * mean
    assert_close(run_ours(proto, model, x)["t"], sc * (xd - mean) / np.sqrt(var + 1e-9) + sh)
    assert load_caffe(proto, model).get_submodule("t").uses_batch_stats


@pytest.mark.parametrize("param, eps", [("", 1e-5), ("bn_param { eps: 0.001 frozen: true }", 1e-3),
                                        ("bn_param { slope_filler { type: \"constant\" value: 1 } momentum: 0.95 }", 1e-5)])
def test_pspnet_bn_matches_numpy(tmp_path, param, eps):
    sc, sh = rand(1, 6, 1, 1, seed=25), rand(1, 6, 1, 1, seed=26)
    mean, var = rand(1, 6, 1, 1, seed=27), np.abs(rand(1, 6, 1, 1, seed=28)) + 0.01
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "BN" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE}, {"t": [sc, sh, mean, var]})
    x = rand(*SHAPE, seed=29)
    ref = sc * (x.astype(np.float64) - mean) / np.sqrt(var.astype(np.float64) + eps) + sh
    assert_close(run_ours(proto, model, x)["t"], ref)


@pytest.mark.parametrize("param, blobs, match", [
    ("", [rand(1, 6, 1, 1)] * 3, "BN expects 2 weight blobs"),
    ("bn_param { bn_mode: INFERENCE }", [rand(1, 6, 1, 1)] * 4, "4 blobs are PSPNet's BN"),
    ("bn_param { eps: 0.001 }", [rand(1, 6, 1, 1)] * 2, "2 blobs are SegNet's BN"),
    ("bn_param { bn_mode: INFERENCE eps: 0.001 }", [rand(1, 6, 1, 1)] * 2, "mixes SegNet's"),
    ("", [rand(1, 5, 1, 1)] * 2, "scale blob has 5 elements"),
])
def test_bn_bad_parameters(tmp_path, param, blobs, match):
    proto, model = make_net(tmp_path, f'layer {{ name: "t" type: "BN" bottom: "data" top: "t" {param} }}',
                            {"data": SHAPE}, {"t": blobs})
    with pytest.raises(ModelError, match=match) as err:
        load_caffe(proto, model)
    assert "'t'" in str(err.value)


# -- written back unchanged ------------------------------------------------------------------------
ALL_TYPES = '''
layer { name: "dw" type: "ConvolutionDepthwise" bottom: "data" top: "dw" convolution_param { num_output: 6 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "dw2" type: "DepthwiseConvolution" bottom: "dw" top: "dw2" convolution_param { num_output: 6 group: 6 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BN" bottom: "dw2" top: "bn" bn_param { bn_mode: INFERENCE } }
layer { name: "r6" type: "ReLU6" bottom: "bn" top: "r6" relu6_param { threshold: 4 } }
layer { name: "sh" type: "ShuffleChannel" bottom: "r6" top: "sh" shuffle_channel_param { group: 3 } }
layer { name: "hs" type: "HardSwish" bottom: "sh" top: "hs" }
layer { name: "hg" type: "HardSigmoid" bottom: "hs" top: "hg" hardsigmoid_param { alpha: 0.25 } }
layer { name: "gp" type: "Pooling" bottom: "hg" top: "gp" pooling_param { pool: AVE global_pooling: true } }
layer { name: "ax" type: "Axpy" bottom: "gp" bottom: "hs" bottom: "sh" top: "ax" }
layer { name: "up" type: "Upsample" bottom: "ax" top: "up" upsample_param { scale: 2 } }
layer { name: "mp" type: "Pooling" bottom: "up" top: "mp" top: "mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "un" type: "Upsample" bottom: "mp" bottom: "mask" top: "un" upsample_param { scale: 2 pad_out_h: true } }
'''
ALL_BLOBS = {"dw": [rand(6, 1, 3, 3, seed=30)], "dw2": [rand(6, 1, 3, 3, seed=31), rand(6, seed=32)],
             "bn": [rand(1, 6, 1, 1, seed=33), rand(1, 6, 1, 1, seed=34)]}


def test_save_caffe_writes_the_fork_layers_back_unchanged(tmp_path):
    proto, model = make_net(tmp_path, ALL_TYPES, {"data": SHAPE}, ALL_BLOBS)
    gm = load_caffe(proto, model)
    out_p, out_m = str(tmp_path / "again.prototxt"), str(tmp_path / "again.caffemodel")
    save_caffe(gm, out_p, out_m)
    before = {l.name: l for l in read_net(proto, model).net.layer}
    after = {l.name: l for l in read_net(out_p, out_m).net.layer}
    for name in ("dw", "dw2", "bn", "r6", "sh", "hs", "hg", "ax", "up", "mp", "un"):
        a, b = before[name], after[name]
        assert a.type == b.type
        for f in ("convolution_param", "bn_param", "relu6_param", "shuffle_channel_param",
                  "hardsigmoid_param", "upsample_param", "pooling_param"):
            assert getattr(a, f) == getattr(b, f), (name, f)
        assert list(a.bottom) == list(b.bottom) and list(a.top) == list(b.top)
        for x, y in zip(a.blobs, b.blobs):
            np.testing.assert_array_equal(np.asarray(x.data), np.asarray(y.data))
    x = rand(*SHAPE, seed=35)
    np.testing.assert_array_equal(run_ours(proto, model, x)["un"], run_ours(out_p, out_m, x)["un"])


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_fork_layers_on_cuda_match_cpu(tmp_path):
    """Device-agnostic: the same net on CUDA (the unpooling's last-writer rule included)."""
    body = ALL_TYPES.replace("kernel_size: 2 stride: 2", "kernel_size: 3 stride: 2 pad: 1")
    proto, model = make_net(tmp_path, body.replace("pad_out_h: true", "upsample_h: 18 upsample_w: 22")
                            .replace("upsample_param { scale: 2 upsample_h", "upsample_param { upsample_h"),
                            {"data": SHAPE}, ALL_BLOBS)
    x = rand(*SHAPE, seed=36)
    assert_close(run_ours(proto, model, x, device="cuda")["un"], run_ours(proto, model, x)["un"], tol=1e-5)
