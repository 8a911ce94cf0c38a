"""Which quantized layers ONNX Runtime still runs in float, and the weight form of a grouped
Deconvolution.

Why: ORT 1.32 has no int8 transposed convolution, and ``ConvInteger`` over a zero-stuffed input
measured 2-26x slower than a float ``ConvTranspose``; so a quantized Deconvolution runs as a float
ConvTranspose over its dequantized input and weights (``inspect`` and the calibrate summary list
these layers, ``float_in_ort``). A per-channel grouped Deconvolution's scales lie along one ONNX
axis only with one output channel per group (``grouped_deconv_row_scales``); otherwise its weight
is written as its dequantized float values, the same numbers. docs/export.md, "Deconvolution"."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["grouped_deconv_row_scales", "dequantized_grouped_deconv", "float_in_ort", "ort_float_layers"]


def grouped_deconv_row_scales(scale_w: np.ndarray, weight_shape: tuple, groups: int) -> Optional[np.ndarray]:
    """The per-output-channel scales laid along axis 0 of a grouped Deconvolution weight
    (C_in, C_out/g, kh, kw): row i belongs to group i // (C_in/g), whose one output channel
    has scale ``scale_w[i // (C_in/g)]``. None when a group has several output channels."""
    c_in, per_group_out = int(weight_shape[0]), int(weight_shape[1])
    if per_group_out != 1 or groups < 1 or c_in % groups:
        return None
    return np.repeat(np.asarray(scale_w, np.float32).reshape(-1), c_in // groups)


def dequantized_grouped_deconv(w_int8: np.ndarray, scale_w: np.ndarray, groups: int) -> np.ndarray:
    """int8 codes × the scale of each weight's output channel, in float32 (one rounding, as
    the fake-quant model's weights): row i of group i // (C_in/g), column j → channel
    (i // (C_in/g))·(C_out/g) + j."""
    w = np.asarray(w_int8)
    c_in, opg = w.shape[0], w.shape[1]
    s = np.asarray(scale_w, np.float32).reshape(groups, opg)
    rows = np.repeat(s, c_in // groups, axis=0)  # (C_in, C_out/g)
    return (w.astype(np.float32) * rows.reshape(rows.shape + (1,) * (w.ndim - 2))).astype(np.float32)


def float_in_ort(mod: Any, per_channel: bool) -> Optional[str]:
    """Why ONNX Runtime runs this quantized layer in float, or None when it runs an int8
    kernel (``per_channel``: its weights have one scale per output channel)."""
    from amct_torch.caffe.layers import traits
    if not traits.is_transposed(mod):
        return None
    why = ("ONNX Runtime has no int8 transposed convolution: a float ConvTranspose over the "
           "dequantized int8 input and weights (the fake-quant numbers)")
    groups = int(getattr(mod, "groups", 1))
    if per_channel and groups > 1 and int(mod.weight.shape[1]) > 1:
        why += ("; its per-channel weights, several output channels per group, have no single "
                "ONNX quantization axis and are written as their dequantized float values")
    return why


def ort_float_layers(gm: Any, per_channel: dict[str, bool]) -> list[tuple[str, str]]:
    """``(layer, why)`` of every quantized layer of ``gm`` (the keys of ``per_channel``: the
    layer's weights have one scale per output channel) that ONNX Runtime runs in float."""
    from amct_torch.caffe.graph import layer_modules
    out = []
    for name, mod in layer_modules(gm).items():
        why = float_in_ort(mod, per_channel[name]) if name in per_channel else None
        if why is not None:
            out.append((name, why))
    return out
