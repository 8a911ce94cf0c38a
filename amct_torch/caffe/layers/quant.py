"""AMCT's own layers in the fake-quant models we write, so that ``load_caffe`` can run them:
Quant (quantize then dequantize, SPEC §5.4/§7) and DeQuant (identity in float)."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe.layers.base import CaffeLayer, register


@register("Quant")
class QuantLayer(CaffeLayer):
    """q = clamp(round(x * scale) + offset, -128, 127); y = (q - offset) / scale, where
    ``quant_param.scale`` is 1/scale_d and ``quant_param.offset`` one byte (int8) = offset_d."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.clamp(torch.round(x * self.scale) + self.offset, -128, 127)
        return (q - self.offset) / self.scale

    def extra_repr(self) -> str:
        return f"name={self.caffe_name!r}, scale={self.scale}, offset={self.offset}"


@register("DeQuant")
class DeQuantLayer(CaffeLayer):
    """Identity in float; its blobs (deq_scale, shift_bit, offset_w) are kept as given."""

    same_shape = True

    def setup(self, blobs, bottom_shapes):
        self._blobs = [] if blobs is None else [np.array(b) for b in blobs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def caffe_blobs(self) -> list[np.ndarray]:
        return [b.copy() for b in self._blobs]
