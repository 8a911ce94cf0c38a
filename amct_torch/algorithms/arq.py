"""ARQ weight quantization (docs/algorithms.md, "ARQ"): symmetric int8, per output channel or per tensor.

Pure tensor function; batched over channels (no Python loop over channels), runs on the
weight's device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from amct_torch.algorithms.quant import FLT_EPS, QMAX, QMIN, channel_view, quantize


@dataclass
class ArqResult:
    """Factors and quantized weights. ``scale_w``/``offset_w`` have C_out entries (per channel)
    or one; ``int8_weight`` and ``fake_quant_weight`` keep the input's layout."""

    scale_w: torch.Tensor          # float32 [C_out] or [1]
    offset_w: torch.Tensor         # int32 zeros, same length
    int8_weight: torch.Tensor      # int8, same shape as the weight
    fake_quant_weight: torch.Tensor  # float32, same shape as the weight


def output_channel_major(weight: torch.Tensor, layer_type: str, group: int = 1) -> torch.Tensor:
    """View the weight as [C_out, -1] (Deconvolution is reordered with its groups first)."""
    from amct_torch.caffe.layers.traits import is_transposed  # the layer classes use algorithms

    if is_transposed(layer_type):
        c_in, c_out_g = weight.shape[0], weight.shape[1]
        rest = tuple(weight.shape[2:])
        w = weight.reshape((group, c_in // group, c_out_g) + rest).transpose(1, 2)
        return w.reshape(group * c_out_g, -1)
    return weight.reshape(weight.shape[0], -1)


def arq_scales(rows: torch.Tensor) -> torch.Tensor:
    """Scale per row of ``rows`` [C, n]: the signed extreme with the larger magnitude v (tie →
    the negative one) gives v/127 if v > 0 else |v|/128; below FLT_EPS → 1.0 (dead channel)."""
    rows = rows.float()
    if rows.shape[0] == 1:  # per tensor: the whole-tensor reduction runs on every thread; the
        # one-row reduction along dim 1 on one (VGG-16's fc6, 103 M weights: 0.03 vs 0.4 s)
        mn, mx = (v.reshape(1) for v in torch.aminmax(rows))
    else:
        mn, mx = torch.aminmax(rows, dim=1)
    positive = mx > -mn
    scale = torch.where(positive, mx / QMAX, (-mn) / (-QMIN))
    return torch.where(scale < FLT_EPS, torch.ones_like(scale), scale)


def arq_scale_w(weight: torch.Tensor, layer_type: str, channel_wise: bool, group: int = 1) -> torch.Tensor:
    """ARQ's scale_w alone (``arq_quantize``'s first step): what the record needs, without the
    quantized copies of the weight (a VGG-16 fc6 is 103 M weights)."""
    from amct_torch.caffe.layers.traits import is_channel_wise, is_weighted

    if not is_weighted(layer_type):
        raise ValueError(f"ARQ: unsupported layer type {layer_type!r}")
    w = weight.detach().float()
    if channel_wise and is_channel_wise(layer_type):
        rows = output_channel_major(w, layer_type, group)
    else:
        rows = w.reshape(1, -1)
    return arq_scales(rows)


def arq_quantize(weight: torch.Tensor, layer_type: str, channel_wise: bool, group: int = 1) -> ArqResult:
    """Quantize a Convolution (C_out, C_in/g, kh, kw), Deconvolution (C_in, C_out/g, kh, kw) or
    InnerProduct (N, K) weight with ARQ; InnerProduct is per-tensor only (``channel_wise``
    ignored there, as config validation forbids it)."""
    w = weight.detach().float()
    scale = arq_scale_w(w, layer_type, channel_wise, group)
    s = channel_view(scale, tuple(w.shape), layer_type, group)
    q8 = quantize(w, s)
    return ArqResult(scale_w=scale, offset_w=torch.zeros(scale.shape, dtype=torch.int32, device=w.device),
                     int8_weight=q8, fake_quant_weight=q8.float() * s)
