"""Helpers for the export tests: a small net built by code, records made with the real ARQ
and an independent min/max for activations, OpenCV custom Quant/DeQuant layers, and the SQNR
by which the tests compare a quantized model's outputs with a reference."""
from __future__ import annotations

import math
from typing import Union

import numpy as np
import torch

from amct_torch.algorithms.arq import arq_quantize
from amct_torch.caffe.graph import layer_modules
from amct_torch.caffe.layers import is_quantizable
from amct_torch.record import LayerRecord


def small_body(conv1: int = 3, conv2: int = 4, fc1: int = 5) -> str:
    """The layers of the small net (conv → ReLU → AVE pool → two 1×1 convs, one without bias →
    Eltwise sum → InnerProduct) with the given output counts (conv2 is also conv3's)."""
    return f'''
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param {{ num_output: {conv1} kernel_size: 3 pad: 1 }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param {{ pool: AVE kernel_size: 2 stride: 2 }} }}
layer {{ name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param {{ num_output: {conv2} kernel_size: 1 }} }}
layer {{ name: "conv3" type: "Convolution" bottom: "pool1" top: "conv3" convolution_param {{ num_output: {conv2} kernel_size: 1 bias_term: false }} }}
layer {{ name: "sum" type: "Eltwise" bottom: "conv2" bottom: "conv3" top: "sum" }}
layer {{ name: "fc1" type: "InnerProduct" bottom: "sum" top: "fc1" inner_product_param {{ num_output: {fc1} }} }}
'''


#: the small net of the export tests (small_blobs gives its weights for an 8×8 input)
SMALL_BODY = small_body()


def small_blobs(rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"conv1": [f(3, 3, 3, 3), f(3)], "conv2": [f(4, 3, 1, 1), f(4)],
            "conv3": [f(4, 3, 1, 1)], "fc1": [f(5, 64) * 0.2, f(5)]}


def minmax_records(gm, x: torch.Tensor) -> dict[str, LayerRecord]:
    """Asymmetric min/max activation factors (zero exactly representable) written here, and
    ARQ weight factors (per channel for convolutions)."""
    seen, hooks, mods = {}, [], layer_modules(gm)
    for n, m in mods.items():
        if is_quantizable(m):
            hooks.append(m.register_forward_pre_hook(
                lambda mod, inp, n=n: seen.__setitem__(n, (float(inp[0].min()), float(inp[0].max())))))
    with torch.no_grad():
        gm(x)
    for h in hooks:
        h.remove()
    recs = {}
    for n, (lo, hi) in seen.items():
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        s = float(np.float32((hi - lo) / 255))
        r = LayerRecord(s, int(np.clip(-round(lo / s) - 128, -128, 127)))
        m = mods[n]
        if m.caffe_type != "Pooling":
            a = arq_quantize(m.weight, m.caffe_type, m.caffe_type != "InnerProduct")
            r.scale_w, r.offset_w = a.scale_w.tolist(), [0] * a.scale_w.numel()
        recs[n] = r
    return recs


def _float64(a: Union[np.ndarray, torch.Tensor]) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, np.float64)


def sqnr_db(ref: Union[np.ndarray, torch.Tensor], got: Union[np.ndarray, torch.Tensor]) -> float:
    """Signal-to-quantization-noise ratio of ``got`` against ``ref`` in dB,
    10·log10(Σref² / Σ(got − ref)²), summed in float64 over every element (numpy arrays or
    torch tensors on any device); +inf when ``got`` equals ``ref``, -inf when ``ref`` is all
    zeros and ``got`` is not."""
    r, g = _float64(ref), _float64(got)
    assert r.shape == g.shape, (r.shape, g.shape)
    err, signal = float(((g - r) ** 2).sum()), float((r ** 2).sum())
    if err == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / err)


class CvQuant:
    """OpenCV custom layer: AMCT Quant from the prototxt params (scale = 1/scale_d; offset as
    the byte's unsigned value 0..255, read back as int8), computed with that inverse scale."""

    def __init__(self, params, blobs):
        self.inv = np.float32(params["scale"])
        o = int(params["offset"])
        self.offset = o - 256 if o > 127 else o

    def getMemoryShapes(self, inputs):
        return inputs

    def forward(self, inputs):
        x = inputs[0].astype(np.float32)
        q = np.clip(np.round(x * self.inv) + self.offset, -128, 127)
        return [((q - self.offset) / self.inv).astype(np.float32)]


class CvDeQuant:
    """OpenCV custom layer: DeQuant is the identity in the fake-quant model."""

    def __init__(self, params, blobs):
        pass

    def getMemoryShapes(self, inputs):
        return inputs

    def forward(self, inputs):
        return [inputs[0]]


_REGISTERED = []


def register_cv_layers() -> None:
    """Register once per process (registering a Python layer twice aborts OpenCV)."""
    import cv2
    if _REGISTERED:
        return
    _REGISTERED.append(True)
    cv2.dnn_registerLayer("Quant", CvQuant)
    cv2.dnn_registerLayer("DeQuant", CvDeQuant)
