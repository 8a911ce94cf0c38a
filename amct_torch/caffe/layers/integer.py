"""Integer semantics of a deploy model (docs/export.md), so that ``load_caffe`` runs the exact int8
model a user ships: weights from ``int8_data``, bias from ``int32_data``, DeQuant factors from
``uint64_data``.

Why float64: Σ code·w_int8 + bias_int32 computed in float64 is exact for every int32
accumulator, on CPU and CUDA alike with torch's own convolutions. The DeQuant after such a layer
multiplies by deq_scale and returns float32; the Quant in front of it emits the codes
q − offset_d (``quant.mark_integer_quants``), as the hardware does."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

SHIFT_MASK = 0xFF


def set_integer(layer, blobs: Optional[list[np.ndarray]], has_bias: bool) -> None:
    """Make a Convolution/Deconvolution/InnerProduct run integer semantics when its weight blob
    is int8 (a deploy model): ``integer`` True and ``int_bias`` the exact int32 bias (float64)."""
    layer.integer = blobs is not None and len(blobs) > 0 and np.asarray(blobs[0]).dtype == np.int8
    if not (layer.integer and has_bias):
        layer.int_bias = None
        return
    assert blobs is not None  # layer.integer says there are blobs
    b = np.asarray(blobs[1])
    if b.dtype != np.int32:
        layer.fail(f"deploy weights are int8 but the bias blob is {b.dtype}, not int32")
    layer.register_buffer("int_bias", torch.from_numpy(b.reshape(-1).astype(np.float64)))


def integer_blobs(layer) -> list[np.ndarray]:
    """A deploy layer's blobs as the file holds them (int8 weight, int32 bias)."""
    w = layer.weight.detach().cpu().numpy()
    if layer.caffe_type == "InnerProduct" and getattr(layer, "transpose", False):
        w = np.ascontiguousarray(w.T)
    out = [np.rint(w).astype(np.int8)]
    if layer.int_bias is not None:
        out.append(layer.int_bias.cpu().numpy().astype(np.int32))
    return out


def unpack_deq(blob: np.ndarray, layer) -> np.ndarray:
    """deq_scale (float32) from AMCT's packed uint64: bits 0–31 the float32, 32–39 shift_bit
    (only 0 is supported), 40–47 offset_w (0)."""
    v = np.asarray(blob, np.uint64).reshape(-1)
    shift = (v >> np.uint64(32)) & np.uint64(SHIFT_MASK)
    if np.any(shift != 0):
        layer.fail("DeQuant shift_bit other than 0 is not supported")
    return (v & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32).copy()
