"""Nets built by code for the runtime-target tests and benchmark: a PReLU face net shaped like
MTCNN's 48×48 output net (every convolution and FC followed by PReLU, so no quantized layer's
output is requantized directly) and a depthwise-separable detector shaped like the RFB/
Ultra-Light face detectors (ConvolutionDepthwise + BN + ReLU, stride-2 stages, a branch
Concat, two heads)."""
from __future__ import annotations

import numpy as np

from helpers.caffe_nets import make_net


def _prelu_conv(name: str, bottom: str, n: int, k: int, s: int = 1) -> str:
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} stride: {s} }} }}\n'
            f'layer {{ name: "{name}_prelu" type: "PReLU" bottom: "{name}" top: "{name}" }}\n')


def _pool(name: str, bottom: str, k: int, s: int) -> str:
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
            f'pooling_param {{ pool: MAX kernel_size: {k} stride: {s} }} }}\n')


def onet_like(folder) -> tuple[str, str]:
    """48×48 input: 4 conv + PReLU (max pools between), FC 256 + PReLU, three FC heads."""
    rng = np.random.default_rng(7)
    body = (_prelu_conv("conv1", "data", 32, 3) + _pool("pool1", "conv1", 3, 2)
            + _prelu_conv("conv2", "pool1", 64, 3) + _pool("pool2", "conv2", 3, 2)
            + _prelu_conv("conv3", "pool2", 64, 3) + _pool("pool3", "conv3", 2, 2)
            + _prelu_conv("conv4", "pool3", 128, 2)
            + 'layer { name: "fc5" type: "InnerProduct" bottom: "conv4" top: "fc5" inner_product_param { num_output: 256 } }\n'
            + 'layer { name: "fc5_prelu" type: "PReLU" bottom: "fc5" top: "fc5" }\n'
            + 'layer { name: "cls" type: "InnerProduct" bottom: "fc5" top: "cls" inner_product_param { num_output: 2 } }\n'
            + 'layer { name: "prob" type: "Softmax" bottom: "cls" top: "prob" }\n'
            + 'layer { name: "bbox" type: "InnerProduct" bottom: "fc5" top: "bbox" inner_product_param { num_output: 4 } }\n'
            + 'layer { name: "landmark" type: "InnerProduct" bottom: "fc5" top: "landmark" inner_product_param { num_output: 10 } }\n')
    shapes = {"conv1": (32, 3, 3), "conv2": (64, 32, 3), "conv3": (64, 64, 3), "conv4": (128, 64, 2)}
    blobs: dict = {}
    for n, (co, ci, k) in shapes.items():
        blobs[n] = [(rng.standard_normal((co, ci, k, k)) * np.sqrt(2 / (ci * k * k))).astype(np.float32),
                    (rng.standard_normal(co) * 0.1).astype(np.float32)]
        blobs[n + "_prelu"] = [(np.abs(rng.standard_normal(co)) * 0.25).astype(np.float32)]
    for n, (co, ci) in {"fc5": (256, 128 * 3 * 3), "cls": (2, 256), "bbox": (4, 256), "landmark": (10, 256)}.items():
        blobs[n] = [(rng.standard_normal((co, ci)) * np.sqrt(1 / ci)).astype(np.float32),
                    (rng.standard_normal(co) * 0.1).astype(np.float32)]
    blobs["fc5_prelu"] = [(np.abs(rng.standard_normal(256)) * 0.25).astype(np.float32)]
    return make_net(folder, body, {"data": [1, 3, 48, 48]}, blobs, name="onet")


def _cbr(name: str, bottom: str, c: int, k: int = 3, pad: int = 1, stride: int = 1,
         kind: str = "Convolution") -> str:
    return (f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {c} kernel_size: {k} pad: {pad} stride: {stride} bias_term: false }} }}\n'
            f'layer {{ name: "{name}_bn" type: "BatchNorm" bottom: "{name}" top: "{name}" batch_norm_param {{ use_global_stats: true }} }}\n'
            f'layer {{ name: "{name}_scale" type: "Scale" bottom: "{name}" top: "{name}" scale_param {{ bias_term: true }} }}\n'
            f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n')


def depthwise_detector(folder, size: tuple[int, int] = (120, 160)) -> tuple[str, str]:
    """Stem conv, five depthwise-separable blocks (three of stride 2), an RFB-like pair of
    branches joined by Concat, and per-anchor class/box heads (plain convolutions)."""
    rng = np.random.default_rng(3)
    blobs: dict = {}

    def add(name, cout, cin_g, k):
        blobs[name] = [(rng.standard_normal((cout, cin_g, k, k)) / np.sqrt(cin_g * k * k)).astype(np.float32)]
        blobs[name + "_bn"] = [(rng.standard_normal(cout) * 0.1).astype(np.float32),
                               (rng.random(cout) + 0.5).astype(np.float32), np.array([1.0], np.float32)]
        blobs[name + "_scale"] = [(rng.random(cout) + 0.5).astype(np.float32),
                                  (rng.standard_normal(cout) * 0.1).astype(np.float32)]

    body, prev, c = _cbr("stem", "data", 16, stride=2), "stem", 16
    add("stem", 16, 3, 3)
    for i, (cout, stride) in enumerate([(32, 1), (32, 2), (64, 1), (64, 2), (128, 2)]):
        body += _cbr(f"dw{i}", prev, c, stride=stride, kind="ConvolutionDepthwise")
        add(f"dw{i}", c, 1, 3)
        body += _cbr(f"pw{i}", f"dw{i}", cout, k=1, pad=0)
        add(f"pw{i}", cout, c, 1)
        prev, c = f"pw{i}", cout
    body += _cbr("b0", prev, 32, k=1, pad=0) + _cbr("b1", prev, 32, k=1, pad=0)
    add("b0", 32, c, 1)
    add("b1", 32, c, 1)
    body += _cbr("b1_dw", "b1", 32, kind="ConvolutionDepthwise")
    add("b1_dw", 32, 1, 3)
    body += 'layer { name: "cat" type: "Concat" bottom: "b0" bottom: "b1_dw" top: "cat" }\n'
    body += _cbr("fuse", "cat", 64, k=1, pad=0)
    add("fuse", 64, 64, 1)
    for head, n in (("cls", 6), ("box", 12)):
        body += (f'layer {{ name: "{head}" type: "Convolution" bottom: "fuse" top: "{head}" '
                 f'convolution_param {{ num_output: {n} kernel_size: 3 pad: 1 }} }}\n')
        blobs[head] = [(rng.standard_normal((n, 64, 3, 3)) / 24).astype(np.float32),
                       (rng.standard_normal(n) * 0.1).astype(np.float32)]
    return make_net(folder, body, {"data": [1, 3, *size]}, blobs, name="dwdet")
