"""AMCT's own layers in the fake-quant models we write, so that ``load_caffe`` can run them:
Quant (quantize then dequantize, docs/export.md) and DeQuant (identity in float)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import fx

from amct_torch.algorithms.quant import QMAX, QMIN, fake_quant
from amct_torch.caffe.layers.base import CaffeLayer, node_layer, register
from amct_torch.caffe.layers.integer import unpack_deq


@register("Quant")
class QuantLayer(CaffeLayer):
    """q = clamp(round(x * scale) + offset, -128, 127); y = (q - offset) / scale, where
    ``quant_param.scale`` is 1/scale_d and ``quant_param.offset`` one byte (int8) = offset_d.

    A file holds only float32(1/scale_d), whose inverse can differ from the record's scale_d
    in the last bit (and so flip a value sitting on a rounding boundary). The exporter's
    in-memory model calls ``set_exact_scale`` so that it computes the fake quantization with the record's
    own scale_d: q = clamp(round(x/scale_d) + offset_d, -128, 127), y = (q - offset_d)·scale_d."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.quant_param
        if not p.HasField("scale") or not p.scale > 0 or not np.isfinite(p.scale):
            self.fail("quant_param.scale must be a finite value > 0")
        raw = bytes(p.offset)
        if len(raw) > 1:
            self.fail(f"quant_param.offset must be one byte, has {len(raw)}")
        self.scale = float(p.scale)
        self.offset = int(np.frombuffer(raw, dtype=np.int8)[0]) if raw else 0
        self.scale_d: Optional[float] = None
        self.emit_codes = False  # deploy model: the next layer computes in integers (integer.py)

    def set_exact_scale(self, scale_d: float, offset_d: int) -> None:
        """Compute with the record's exact ``scale_d`` (division) instead of the file's
        1/scale_d (multiplication)."""
        if not (np.isfinite(scale_d) and scale_d > 0) or not QMIN <= int(offset_d) <= QMAX:
            self.fail(f"invalid quantization factors scale_d={scale_d!r}, offset_d={offset_d!r}")
        self.scale_d = float(np.float32(scale_d))
        self.offset = int(offset_d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale_d is not None:
            return fake_quant(x, self.scale_d, self.offset)
        q = torch.clamp(torch.round(x * self.scale) + self.offset, QMIN, QMAX)
        if self.emit_codes:
            return q - self.offset
        return (q - self.offset) / self.scale

    def extra_repr(self) -> str:
        exact = "" if self.scale_d is None else f", scale_d={self.scale_d}"
        return f"name={self.caffe_name!r}, scale={self.scale}, offset={self.offset}{exact}"


@register("DeQuant")
class DeQuantLayer(CaffeLayer):
    """Identity in the fake-quant model (float blobs deq_scale, shift_bit, offset_w, kept as
    given). In a deploy model (one ``uint64_data`` blob) it turns the integer layer's
    accumulator into float32: y = acc·deq_scale per output channel (axis 1)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        self._blobs = [] if blobs is None else [np.array(b) for b in blobs]
        if len(self._blobs) == 1 and self._blobs[0].dtype == np.uint64:
            self.register_buffer("deq_scale", torch.from_numpy(unpack_deq(self._blobs[0], self)))
        else:
            self.deq_scale: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deq_scale is None:
            return x
        d = self.deq_scale.to(torch.float64)
        if d.numel() > 1:
            d = d.view((1, -1) + (1,) * (x.dim() - 2))
        return (x.to(torch.float64) * d).to(torch.float32)

    def caffe_blobs(self) -> list[np.ndarray]:
        return [b.copy() for b in self._blobs]


def mark_integer_quants(gm: fx.GraphModule) -> int:
    """Let each Quant layer whose consumers all end in an integer DeQuant (a deploy model) emit
    codes instead of dequantized values; returns how many were marked."""
    def integer_dequant(v: fx.Node) -> bool:
        mod = node_layer(gm, v)
        return isinstance(mod, DeQuantLayer) and mod.deq_scale is not None

    def integer_user(u: fx.Node) -> bool:
        return u.op == "call_module" and any(integer_dequant(v) for v in u.users)

    marked = 0
    for node in gm.graph.nodes:
        quant = node_layer(gm, node)
        if not isinstance(quant, QuantLayer):
            continue
        users = list(node.users)
        if users and all(integer_user(u) for u in users):
            quant.emit_codes = True
            marked += 1
    return marked
