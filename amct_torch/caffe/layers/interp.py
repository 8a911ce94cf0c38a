"""Resizing and per-sample normalisation of the segmentation forks: ``Interp`` (PSPNet,
ICNet, DeepLab: bilinear with aligned corners after cropping by ``pad_beg``/``pad_end``) and
BVLC's ``MVN`` (mean-variance normalisation, used by segmentation and style nets).

Why here and not in ``pooling``/``norm``: both are parameter-free reshaping/normalising layers
with fork-specific output-size rules; keeping the rules next to the module keeps the shape
function (``infer_shapes``) and the forward in one place.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from amct_torch.caffe.layers.base import CaffeLayer, Shape, register


@register("Interp")
class InterpLayer(CaffeLayer):
    """PSPNet's ``Interp``: crop ``[-pad_beg, H + pad_end)`` (pads are <= 0), then resize with
    Caffe's ``caffe_cpu_interp2`` (bilinear, corners aligned; an output of size 1 takes the first
    row/column). Output size, in the fork's order of precedence: a second bottom's H×W (ICNet /
    segmentation forks); ``shrink_factor`` alone: (H_eff − 1) / s + 1; ``zoom_factor`` alone:
    H_eff + (H_eff − 1)(z − 1); ``height`` and ``width``; both factors: shrink then zoom."""

    bottoms = (1, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.interp_param
        self.pad_beg, self.pad_end = int(p.pad_beg), int(p.pad_end)
        if self.pad_beg > 0 or self.pad_end > 0:
            self.fail(f"Interp supports only non-positive pad_beg/pad_end (cropping), got "
                      f"{self.pad_beg}/{self.pad_end}")
        self.zoom = int(p.zoom_factor) if p.HasField("zoom_factor") else None
        self.shrink = int(p.shrink_factor) if p.HasField("shrink_factor") else None
        if self.zoom is not None and self.zoom < 1:
            self.fail(f"Interp zoom_factor must be >= 1, got {self.zoom}")
        if self.shrink is not None and self.shrink < 1:
            self.fail(f"Interp shrink_factor must be >= 1, got {self.shrink}")
        self.size: Optional[tuple[int, int]] = None
        if p.HasField("height") or p.HasField("width"):
            if not (p.HasField("height") and p.HasField("width")):
                self.fail("Interp needs both height and width (or a zoom/shrink factor)")
            if p.height < 1 or p.width < 1:
                self.fail(f"Interp height and width must be positive, got {p.height}x{p.width}")
            self.size = (int(p.height), int(p.width))
        if len(self.layer_param.bottom) == 1 and self.zoom is None and self.shrink is None and self.size is None:
            self.fail("Interp needs zoom_factor, shrink_factor, height and width, or a second bottom "
                      "giving the output size")

    def out_size(self, h: int, w: int, ref: Optional[Shape] = None) -> tuple[int, int]:
        """The fork's output size for an input of h×w (``ref``: the second bottom's shape)."""
        he, we = h + self.pad_beg + self.pad_end, w + self.pad_beg + self.pad_end
        if he < 1 or we < 1:
            self.fail(f"Interp crops the {h}x{w} input to nothing (pad_beg {self.pad_beg}, pad_end {self.pad_end})")
        if ref is not None:
            return int(ref[2]), int(ref[3])
        if self.shrink is not None and self.zoom is None:
            return (he - 1) // self.shrink + 1, (we - 1) // self.shrink + 1
        if self.zoom is not None and self.shrink is None:
            return he + (he - 1) * (self.zoom - 1), we + (we - 1) * (self.zoom - 1)
        if self.size is not None:
            return self.size
        ho, wo = (he - 1) // self.shrink + 1, (we - 1) // self.shrink + 1  # type: ignore[operator]
        return ho + (ho - 1) * (self.zoom - 1), wo + (wo - 1) * (self.zoom - 1)  # type: ignore[operator]

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) != 4:
            self.fail(f"Interp takes a 4-D input, got {list(s)}")
        ho, wo = self.out_size(s[2], s[3], bottom_shapes[1] if len(bottom_shapes) > 1 else None)
        return [(s[0], s[1], ho, wo)]

    def forward(self, x: torch.Tensor, ref: Optional[torch.Tensor] = None) -> torch.Tensor:
        h, w = x.shape[-2], x.shape[-1]
        ho, wo = self.out_size(h, w, None if ref is None else tuple(ref.shape))
        if self.pad_beg or self.pad_end:
            x = x[..., -self.pad_beg:h + self.pad_end, -self.pad_beg:w + self.pad_end]
        return F.interpolate(x, size=(ho, wo), mode="bilinear", align_corners=True)


@register("MVN")
class MVNLayer(CaffeLayer):
    """BVLC's MVN: per sample (and per channel unless ``across_channels``) subtract the mean;
    with ``normalize_variance`` divide by sqrt(variance) + eps (eps added after the root, as
    Caffe does). Statistics span all axes from 1 (or 2) on, so any rank >= 2 works."""

    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.mvn_param
        self.normalize_variance = bool(p.normalize_variance)
        self.across_channels = bool(p.across_channels)
        self.eps = float(p.eps)
        if not self.eps >= 0:
            self.fail(f"MVN eps must be >= 0, got {self.eps}")
        if bottom_shapes is not None and len(bottom_shapes[0]) < 2:
            self.fail(f"MVN takes an input of rank >= 2, got {list(bottom_shapes[0])}")

    def axes(self, ndim: int) -> list[int]:
        """The axes the statistics are taken over."""
        return list(range(1 if self.across_channels else 2, ndim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axes = self.axes(x.dim())
        if not axes:  # (N, C) per channel: one value per statistic
            return torch.zeros_like(x)
        d = x - x.mean(dim=axes, keepdim=True)
        if not self.normalize_variance:
            return d
        var = (d * d).mean(dim=axes, keepdim=True)
        return d / (var.sqrt() + self.eps)
