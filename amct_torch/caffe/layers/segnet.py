"""The forks' own ``BN`` layer type (``bn_param``), in its two blob layouts.

* SegNet: two blobs, scale and shift (1, C, 1, 1); ``bn_mode: INFERENCE`` is
  y = scale * x + shift, the default ``LEARN`` normalises with the batch's own statistics even
  at test time (biased variance over N, H, W; eps 1e-9).
* PSPNet / yjxiong's fork: four blobs, slope, bias, running mean and variance;
  y = slope * (x - mean) / sqrt(var + eps) + bias.

The blob count tells the layouts apart; without weights the fields written decide (PSPNet's
fields: PSPNet; otherwise SegNet)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from amct_torch.caffe.layers.base import CaffeLayer, register, to_numpy

_INFERENCE = 1
_SEGNET_EPS = 1e-9
_PSPNET_FIELDS = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine")
_SEGNET_FIELDS = ("scale_filler", "shift_filler", "bn_mode")


@register("BN")
class BNLayer(CaffeLayer):
    """The forks' BN: ``scale``/``shift`` per channel, with running ``mean``/``var`` (PSPNet) or
    the batch's statistics (SegNet LEARN) or none (SegNet INFERENCE)."""

    per_sample = True
    same_shape = True
    bias: torch.Tensor  # SegNet's shift or PSPNet's bias: always set
    mean: Optional[torch.Tensor]  # PSPNet's running statistics (buffers); None for SegNet
    var: Optional[torch.Tensor]

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.bn_param
        psp_fields = [f for f in _PSPNET_FIELDS if p.HasField(f)]
        seg_fields = [f for f in _SEGNET_FIELDS if p.HasField(f)]
        if psp_fields and seg_fields:
            self.fail(f"bn_param mixes SegNet's {', '.join(seg_fields)} with PSPNet's {', '.join(psp_fields)}")
        if blobs is not None and len(blobs) not in (2, 4):
            self.fail(f"BN expects 2 weight blobs (SegNet: scale, shift) or 4 (PSPNet: slope, bias, "
                      f"mean, variance), the caffemodel has {len(blobs)}")
        self.pspnet = len(blobs) == 4 if blobs is not None else bool(psp_fields)
        if self.pspnet and seg_fields:
            self.fail(f"4 blobs are PSPNet's BN, but bn_param sets SegNet's {', '.join(seg_fields)}")
        if not self.pspnet and psp_fields:
            self.fail(f"2 blobs are SegNet's BN, but bn_param sets PSPNet's {', '.join(psp_fields)}")
        self.eps = float(p.eps) if self.pspnet else _SEGNET_EPS
        if self.pspnet and not (np.isfinite(self.eps) and self.eps >= 0):
            self.fail(f"bn_param.eps must be >= 0, got {self.eps}")
        self.uses_batch_stats = not self.pspnet and p.bn_mode != _INFERENCE
        c: Optional[int] = None
        if bottom_shapes is not None and len(bottom_shapes[0]) >= 2:
            c = int(bottom_shapes[0][1])
        if blobs is None:
            if c is None:
                self.fail("no weights and no input shape to size them")
            arrays = [np.ones(c), np.zeros(c)] + ([np.zeros(c), np.ones(c)] if self.pspnet else [])
        else:
            arrays = list(blobs)
            if c is None:
                c = int(arrays[0].size)
        names = ("scale", "shift", "mean", "variance")
        tensors = [self.blob_as(a, (c,), names[i]) for i, a in enumerate(arrays)]
        self.weight = nn.Parameter(tensors[0])
        self.bias = nn.Parameter(tensors[1])
        if self.pspnet:
            if bool((tensors[3] + self.eps <= 0).any()):
                self.fail("variance + eps must be > 0 in every channel")
            self.register_buffer("mean", tensors[2])
            self.register_buffer("var", tensors[3])
        else:
            self.mean = None
            self.var = None
        self.blob_shape = tuple(int(d) for d in np.shape(blobs[0])) if blobs else (1, c, 1, 1)

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) < 2 or s[1] != self.weight.numel():
            self.fail(f"input {list(s)} does not have the {self.weight.numel()} channels of the blobs")
        return [tuple(s)]

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return t.reshape((1, -1) + (1,) * (x.dim() - 2)).to(x.dtype)

    def _running(self) -> tuple[torch.Tensor, torch.Tensor]:
        """PSPNet's running mean and variance."""
        assert self.mean is not None and self.var is not None  # set in setup when pspnet
        return self.mean, self.var

    def affine(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(a, b) with y = a * x + b per channel, or None when the batch's statistics are used."""
        if self.uses_batch_stats:
            return None
        if not self.pspnet:
            return self.weight, self.bias
        mean, var = self._running()
        inv = torch.pow(var + self.eps, -0.5)
        return self.weight * inv, self.bias - self.weight * inv * mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pspnet:  # Caffe's order: subtract, times (var + eps)^-1/2, times slope, plus bias
            mean, var = self._running()
            inv = torch.pow(var + self.eps, -0.5)
            y = (x - self._view(mean, x)) * self._view(inv, x)
            return y * self._view(self.weight, x) + self._view(self.bias, x)
        if not self.uses_batch_stats:
            return x * self._view(self.weight, x) + self._view(self.bias, x)
        dims = [0] + list(range(2, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = (x * x).mean(dim=dims, keepdim=True) - mean * mean
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self._view(self.weight, x) + self._view(self.bias, x)

    def caffe_blobs(self) -> list[np.ndarray]:
        out = [to_numpy(self.weight), to_numpy(self.bias)]
        if self.pspnet:
            out += [to_numpy(t) for t in self._running()]
        return [a.reshape(self.blob_shape) for a in out]

    def extra_repr(self) -> str:
        kind = "PSPNet" if self.pspnet else ("SegNet LEARN (batch statistics)" if self.uses_batch_stats
                                             else "SegNet INFERENCE")
        return f"name={self.caffe_name!r}, {kind}, channels={self.weight.numel()}"
