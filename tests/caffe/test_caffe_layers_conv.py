"""Convolution, Deconvolution and InnerProduct against OpenCV's Caffe importer."""
from __future__ import annotations

import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

CONV_CASES = [  # (conv params, C_in, num_output, group, kernel (h, w))
    ("kernel_size: 3", 3, 4, 1, (3, 3)),
    ("kernel_size: 3 pad: 1 stride: 2", 3, 4, 1, (3, 3)),
    ("kernel_size: 3 pad: 2 dilation: 2", 3, 5, 1, (3, 3)),
    ("kernel_size: 3 pad: 1 group: 2", 4, 6, 2, (3, 3)),
    ("kernel_size: 3 pad: 1 group: 4", 4, 4, 4, (3, 3)),  # depthwise
    ("kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride_h: 2 stride_w: 1", 3, 4, 1, (3, 1)),
    ("kernel_size: 5 kernel_size: 3 pad: 2 pad: 0 stride: 1 stride: 2", 3, 4, 1, (5, 3)),
    ("kernel_size: 1 bias_term: false", 3, 8, 1, (1, 1)),
]


def _matches_opencv(tmp_path, kind: str, param: str, blobs: list, shape: tuple, device: str = "cpu",
                    **net) -> None:
    """One ``kind`` layer (``param`` its convolution_param) on a random input of ``shape``:
    ours on ``device`` equals OpenCV's output. ``net``: further arguments of ``make_net``."""
    body = f'layer {{ name: "y" type: "{kind}" bottom: "data" top: "y" convolution_param {{ {param} }} }}'
    proto, model = make_net(tmp_path, body, {"data": shape}, {"y": blobs}, **net)
    x = rand(*shape, seed=3)
    assert_close(run_ours(proto, model, x, device=device)["y"], run_cv(proto, model, {"data": x}, ["y"])["y"])


def _with_bias(weight, cout: int, params: str) -> list:
    return [weight] + ([] if "bias_term: false" in params else [rand(cout, seed=2)])


@pytest.mark.parametrize("params,cin,cout,group,k", CONV_CASES)
def test_convolution_matches_opencv(tmp_path, params, cin, cout, group, k, device):
    _matches_opencv(tmp_path, "Convolution", f"num_output: {cout} {params}",
                    _with_bias(rand(cout, cin // group, *k, seed=1), cout, params), (2, cin, 11, 14), device)


def test_convolution_legacy_4d_blobs(tmp_path):
    """A legacy blob (num, channels, height, width) for the bias (1, 1, 1, C) is right-aligned."""
    _matches_opencv(tmp_path, "Convolution", "num_output: 4 kernel_size: 3",
                    [rand(4, 3, 3, 3, seed=1), rand(1, 1, 1, 4, seed=2)], (1, 3, 8, 8), legacy=True)


DECONV_CASES = [
    ("kernel_size: 3", 3, 4, 1),
    ("kernel_size: 4 stride: 2 pad: 1", 3, 4, 1),
    ("kernel_size: 3 stride: 2 pad: 1 group: 2", 4, 6, 2),
    ("kernel_size: 2 stride: 2 bias_term: false", 2, 2, 1),
]


@pytest.mark.parametrize("params,cin,cout,group", DECONV_CASES)
def test_deconvolution_matches_opencv(tmp_path, params, cin, cout, group, device):
    k = int(params.split("kernel_size: ")[1].split()[0])
    _matches_opencv(tmp_path, "Deconvolution", f"num_output: {cout} {params}",
                    _with_bias(rand(cin, cout // group, k, k, seed=1), cout, params), (2, cin, 7, 9), device)


@pytest.mark.parametrize("params,in_shape,k", [
    ("", (3, 4, 5, 6), 120),
    ("bias_term: false", (3, 4, 5, 6), 120),
    ("axis: 2", (3, 4, 5, 6), 30),
])
def test_inner_product_matches_opencv(tmp_path, params, in_shape, k, device):
    body = f'layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param {{ num_output: 7 {params} }} }}'
    blobs = [rand(7, k, seed=1)] + ([] if "bias_term: false" in params else [rand(7, seed=2)])
    proto, model = make_net(tmp_path, body, {"data": in_shape}, {"fc": blobs})
    x = rand(*in_shape, seed=3)
    ours = run_ours(proto, model, x, device=device)["fc"]
    ref = run_cv(proto, model, {"data": x}, ["fc"])["fc"]
    assert ours.shape == (in_shape[:2] + (7,) if "axis: 2" in params else (3, 7))
    assert_close(ours, ref)


def test_inner_product_transpose_against_numpy(tmp_path):
    """transpose: true stores the weight as (K, N): y = x_flat @ W + b (plain numpy reference)."""
    body = 'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 5 transpose: true } }'
    w, b = rand(24, 5, seed=1), rand(5, seed=2)
    proto, model = make_net(tmp_path, body, {"data": (2, 2, 3, 4)}, {"fc": [w, b]})
    x = rand(2, 2, 3, 4, seed=3)
    ours = run_ours(proto, model, x)["fc"]
    assert_close(ours, x.reshape(2, -1) @ w + b, 1e-5)


def test_inner_product_legacy_right_aligned_weight(tmp_path):
    """Legacy InnerProduct weight (1, 1, N, K) and bias (1, 1, 1, N)."""
    body = 'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 3 } }'
    w, b = rand(1, 1, 3, 8, seed=1), rand(1, 1, 1, 3, seed=2)
    proto, model = make_net(tmp_path, body, {"data": (2, 8)}, {"fc": [w, b]}, legacy=True)
    x = rand(2, 8, seed=3)
    assert_close(run_ours(proto, model, x)["fc"], x @ w.reshape(3, 8).T + b.reshape(3), 1e-5)
