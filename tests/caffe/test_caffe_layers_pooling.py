"""Pooling against a literal transcription of Caffe's PoolingLayer loops and OpenCV."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours


def caffe_pool_reference(x, method, k, s, p, ceil=True):
    """Caffe's CPU Forward_cpu written out with loops (MAX, AVE) plus the GPU test-time
    stochastic rule; output size from PoolingLayer::Reshape."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    rnd = math.ceil if ceil else math.floor
    oh = int(rnd((h + 2 * ph - kh) / sh)) + 1
    ow = int(rnd((w + 2 * pw - kw) / sw)) + 1
    if ph or pw:
        if (oh - 1) * sh >= h + ph:
            oh -= 1
        if (ow - 1) * sw >= w + pw:
            ow -= 1
    out = np.zeros((n, c, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            if method == "STOCHASTIC":
                hs, ws = i * sh, j * sw
                he, we = min(hs + kh, h), min(ws + kw, w)
                win = x[:, :, hs:he, ws:we].astype(np.float64)
                tot = win.sum(axis=(2, 3))
                out[:, :, i, j] = np.where(tot > 0, (win * win).sum(axis=(2, 3)) / np.where(tot > 0, tot, 1), 0)
                continue
            hs, ws = i * sh - ph, j * sw - pw
            if method == "MAX":
                he, we = min(hs + kh, h), min(ws + kw, w)
                hs, ws = max(hs, 0), max(ws, 0)
                out[:, :, i, j] = x[:, :, hs:he, ws:we].max(axis=(2, 3))
            else:
                he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                size = (he - hs) * (we - ws)
                hs, ws = max(hs, 0), max(ws, 0)
                he, we = min(he, h), min(we, w)
                out[:, :, i, j] = x[:, :, hs:he, ws:we].sum(axis=(2, 3)) / size
    return out.astype(np.float32)


CASES = [  # (kernel, stride, pad, H, W)
    (3, 2, 0, 112, 112),   # nsfw pool1: ceil adds a window
    (3, 2, 0, 9, 10),
    (2, 2, 0, 7, 7),
    (3, 2, 1, 8, 9),       # pad > 0: the last-window rule
    (3, 3, 1, 10, 11),
    (3, 2, 2, 8, 9),       # pad >= kernel/2 (torch refuses, Caffe allows)
    (4, 3, 3, 9, 13),
    (5, 1, 2, 6, 6),
    (7, 1, 0, 7, 7),       # nsfw final pool
    (2, 2, 0, 8, 10),      # VGG's pools: whole 2x2 tiles (MAX on CPU: maxima of strided views)
    (3, 3, 0, 9, 12),      # whole 3x3 tiles
]


@pytest.mark.parametrize("c", [3, 16])  # 16: MAX on CPU takes the channels-last or the tiles path
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("k,s,p,h,w", CASES)
def test_pooling_ceil_matches_caffe_and_opencv(tmp_path, method, k, s, p, h, w, c, device):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" '
            f'pooling_param {{ pool: {method} kernel_size: {k} stride: {s} pad: {p} }} }}')
    proto, model = make_net(tmp_path, body, {"data": (2, c, h, w)})
    x = rand(2, c, h, w, seed=k * 100 + h)
    ours = run_ours(proto, model, x, device=device)["pool"]
    ref = caffe_pool_reference(x, method, (k, k), (s, s), (p, p))
    assert ours.shape == ref.shape
    assert_close(ours, ref, 1e-5)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["pool"])["pool"], 1e-5)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("k,s,p,h,w", [(3, 2, 0, 9, 10), (3, 2, 1, 8, 9), (3, 2, 2, 8, 9), (2, 2, 0, 7, 7)])
def test_pooling_floor_round_mode(tmp_path, method, k, s, p, h, w):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param {{ '
            f'pool: {method} kernel_size: {k} stride: {s} pad: {p} round_mode: FLOOR }} }}')
    proto, model = make_net(tmp_path, body, {"data": (1, 2, h, w)})
    x = rand(1, 2, h, w, seed=5)
    ours = run_ours(proto, model, x)["pool"]
    ref = caffe_pool_reference(x, method, (k, k), (s, s), (p, p), ceil=False)
    assert ours.shape == ref.shape
    assert_close(ours, ref, 1e-5)


def test_pooling_rectangular_kernel(tmp_path):
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param { pool: AVE '
            'kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 1 } }')
    proto, model = make_net(tmp_path, body, {"data": (1, 2, 9, 8)})
    x = rand(1, 2, 9, 8, seed=6)
    ours = run_ours(proto, model, x)["pool"]
    assert_close(ours, caffe_pool_reference(x, "AVE", (3, 2), (2, 1), (1, 1)), 1e-5)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["pool"])["pool"], 1e-5)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(tmp_path, method, device):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" '
            f'pooling_param {{ pool: {method} global_pooling: true }} }}')
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 7, 5)})
    x = rand(2, 3, 7, 5, seed=7)
    ours = run_ours(proto, model, x, device=device)["pool"]
    ref = x.max(axis=(2, 3), keepdims=True) if method == "MAX" else x.mean(axis=(2, 3), keepdims=True)
    assert ours.shape == (2, 3, 1, 1)
    assert_close(ours, ref, 1e-5)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["pool"])["pool"], 1e-5)


def test_stochastic_pooling_test_time_rule(tmp_path):
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" '
            'pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 } }')
    proto, model = make_net(tmp_path, body, {"data": (1, 2, 9, 8)})
    x = np.abs(rand(1, 2, 9, 8, seed=8))
    x[0, 0, :3, :3] = 0  # an all-zero window gives 0
    ours = run_ours(proto, model, x)["pool"]
    assert_close(ours, caffe_pool_reference(x, "STOCHASTIC", (3, 3), (2, 2), (0, 0)), 1e-5)
    assert ours[0, 0, 0, 0] == 0


@pytest.mark.parametrize("kernel", [(2, 2), (2, 3), (3, 1), (4, 4)])
def test_tiled_max_pool_equals_torch_bit_for_bit_nan_included(kernel):
    """The tiles path is exact: the same values as torch's own max-pool, NaN propagated."""
    import torch
    import torch.nn.functional as F

    from amct_torch.caffe.layers.pooling import _max_pool2d, _tiles

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 8 * kernel[0], 5 * kernel[1], generator=g)
    x[0, 1, 0, 0] = float("nan")
    x[1, 4, -1, -1] = float("-inf")
    assert _tiles(x, kernel, kernel, (0, 0))
    ours = _max_pool2d(x, kernel, kernel)
    ref = F.max_pool2d(x, kernel, kernel)
    assert ours.is_contiguous()
    torch.testing.assert_close(ours, ref, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(ours[0, 1, 0, 0])
