"""Fake-quantization arithmetic shared by calibration, export and tests (docs/algorithms.md).

One definition of the int8 grid so that the torch fake-quant model, the deploy int8 weights
and ONNX Runtime's QuantizeLinear agree bit for bit: ``round`` is half-to-even (``torch.round``)
and the int8 range is [-128, 127].
"""
from __future__ import annotations

import math
import struct
from typing import Union

import torch

FLT_EPS = 1.1920929e-07
QMIN = -128
QMAX = 127

Scalar = Union[float, int, torch.Tensor]


def to_float32(v: float) -> float:
    """``v`` rounded to float32 (nearest, ties to even; ±inf past the float32 range), as
    float(torch.tensor(v, dtype=torch.float32)) gives, without a tensor (a few µs a call
    on the observers' per-batch path)."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def quantize(x: torch.Tensor, scale: Scalar, offset: Scalar = 0) -> torch.Tensor:
    """int8 codes ``clamp(round(x/scale) + offset, -128, 127)`` (returned as int8); the steps
    after the division in place (the writers quantize every weight of the model: fewer
    temporaries, same values)."""
    q = torch.div(x, scale).round_()
    if not (isinstance(offset, (int, float)) and offset == 0):
        q = q + offset  # out of place: an offset may broadcast beyond x
    return q.clamp_(QMIN, QMAX).to(torch.int8)


def fake_quant(x: torch.Tensor, scale: Scalar, offset: Scalar = 0) -> torch.Tensor:
    """Activation fake-quant: ``(clamp(round(x/s) + o, -128, 127) - o) * s``.

    Computed in float32 whatever ``x``'s dtype (fp16/bf16 data is upcast), result in x's dtype.
    """
    if not isinstance(offset, (int, float)) or (x.requires_grad and torch.is_grad_enabled()):
        q = torch.round(x.float() / scale) + offset   # an offset may broadcast beyond x
        return ((q.clamp(QMIN, QMAX) - offset) * scale).to(x.dtype)
    # one temporary, the steps in place: the same values, about half the time on a large
    # activation (each new temporary of that size is a pass over freshly mapped memory)
    q = torch.div(x.float(), scale)
    q.round_().add_(offset).clamp_(QMIN, QMAX).sub_(offset).mul_(scale)
    return q.to(x.dtype)


def channel_view(values: torch.Tensor, layout_shape: tuple, layer_type: str, group: int = 1) -> torch.Tensor:
    """Reshape per-output-channel ``values`` [C_out] (or [1]) so they broadcast against a weight
    of ``layout_shape`` in its own (torch/Caffe) layout.

    Convolution/InnerProduct: output channel is axis 0. Deconvolution (C_in, C_out/g, kh, kw):
    element (i, j, ...) belongs to output channel ``(i // (C_in/g)) * (C_out/g) + j``.
    """
    from amct_torch.caffe.layers.traits import is_transposed  # the layer classes use this module

    if values.numel() == 1:
        return values.reshape([1] * len(layout_shape))
    if is_transposed(layer_type):
        c_in, c_out_g = layout_shape[0], layout_shape[1]
        per = values.reshape(group, 1, c_out_g).expand(group, c_in // group, c_out_g)
        return per.reshape([c_in, c_out_g] + [1] * (len(layout_shape) - 2))
    return values.reshape([layout_shape[0]] + [1] * (len(layout_shape) - 1))
