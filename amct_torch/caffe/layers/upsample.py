"""The forks' ``Upsample`` type, and the argmax mask of a MAX Pooling's second top.

Two forks use the one type name: darknet2caffe/caffe-yolov3 (one bottom: nearest-neighbour
upsampling by the integer ``scale``) and SegNet (two bottoms, the values and a MAX Pooling's
mask: max-unpooling into ``upsample_h`` x ``upsample_w`` or H * scale_h - pad_out_h by
W * scale_w - pad_out_w, a later value winning a shared position, an index outside the output
dropped). ``max_pool_with_mask`` computes Caffe's mask: float indices h * W + w of each
window's first maximum in raster order. docs/caffe_format.md, "Supported layer types"."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from amct_torch.caffe.layers.base import CaffeLayer, register


def max_pool_with_mask(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
                       pad: tuple[int, int], out_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Caffe's MAX pooling of ``x`` (…, H, W) to ``out_hw`` and its mask (float h * W + w of
    each window's first maximum; -1 for a window that holds no input element)."""
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = kernel, stride, pad, out_hw
    h, w = x.shape[-2], x.shape[-1]
    rh = max(0, (oh - 1) * sh + kh - h - ph)
    rw = max(0, (ow - 1) * sw + kw - w - pw)
    xp = F.pad(x, (pw, rw, ph, rh), value=torch.finfo(x.dtype).min) if (ph or pw or rh or rw) else x
    y, idx = F.max_pool2d(xp, (kh, kw), (sh, sw), return_indices=True)
    y, idx = y[..., :oh, :ow], idx[..., :oh, :ow]
    wp = w + pw + rw
    r, c = torch.div(idx, wp, rounding_mode="floor") - ph, idx % wp - pw
    inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    mask = torch.where(inside, r * w + c, torch.full_like(idx, -1))
    return y.contiguous(), mask.to(x.dtype)


@register("Upsample")
class UpsampleLayer(CaffeLayer):
    """darknet2caffe's nearest Upsample (one bottom) or SegNet's max-unpooling (two bottoms)."""

    per_sample = True
    bottoms = (1, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.upsample_param
        self.unpool = len(self.layer_param.bottom) == 2
        if not self.unpool:
            extra = [f for f in ("scale_h", "scale_w", "pad_out_h", "pad_out_w", "upsample_h", "upsample_w")
                     if p.HasField(f)]
            if extra:
                self.fail(f"upsample_param {', '.join(extra)} belong to SegNet's Upsample, which takes "
                          "a second bottom (the pooling mask); nearest Upsample reads only scale")
            self.scale = int(p.scale) if p.HasField("scale") else 1
            if self.scale < 1:
                self.fail(f"upsample_param.scale must be >= 1, got {self.scale}")
            return
        self.out_hw = None
        if p.HasField("upsample_h") or p.HasField("upsample_w"):
            if not (p.HasField("upsample_h") and p.HasField("upsample_w")):
                self.fail("upsample_h and upsample_w must be given together")
            if p.upsample_h <= 1 or p.upsample_w <= 1:
                self.fail("upsample_h and upsample_w must be > 1")
            self.out_hw = (int(p.upsample_h), int(p.upsample_w))
            return
        if p.HasField("scale_h") != p.HasField("scale_w"):
            self.fail("scale_h and scale_w must be given together")
        if p.HasField("scale_h"):
            if p.HasField("scale"):
                self.fail("give scale or scale_h/scale_w, not both")
            self.scale_hw = (int(p.scale_h), int(p.scale_w))
        else:
            s = int(p.scale) if p.HasField("scale") else 2
            self.scale_hw = (s, s)
        if min(self.scale_hw) <= 1:
            self.fail(f"the unpooling scale must be > 1, got {list(self.scale_hw)}")
        self.pad_out = (int(p.pad_out_h), int(p.pad_out_w))
        for flag, s, axis in zip(self.pad_out, self.scale_hw, "hw"):
            if flag and s != 2:
                self.fail(f"pad_out_{axis} needs scale_{axis} 2, got {s}")

    def _unpool_hw(self, h: int, w: int) -> tuple[int, int]:
        if self.out_hw is not None:
            return self.out_hw
        return h * self.scale_hw[0] - self.pad_out[0], w * self.scale_hw[1] - self.pad_out[1]

    def infer_shapes(self, bottom_shapes):
        s = tuple(bottom_shapes[0])
        if len(s) != 4:
            self.fail(f"Upsample needs a 4-D input, got {list(s)}")
        if not self.unpool:
            return [s[:2] + (s[2] * self.scale, s[3] * self.scale)]
        if tuple(bottom_shapes[1]) != s:
            self.fail(f"the mask {list(bottom_shapes[1])} must have the shape of the input {list(s)}")
        oh, ow = self._unpool_hw(s[2], s[3])
        if oh < 1 or ow < 1:
            self.fail(f"input {list(s)} gives an empty output")
        return [s[:2] + (oh, ow)]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        n, c, h, w = x.shape
        if not self.unpool:
            s = self.scale
            if s == 1:
                return x.clone()
            return x[:, :, :, None, :, None].expand(n, c, h, s, w, s).reshape(n, c, h * s, w * s)
        oh, ow = self._unpool_hw(h, w)
        size = oh * ow
        assert mask is not None  # an unpooling layer has two bottoms (checked when it is built)
        idx = mask.reshape(n, c, h * w).to(torch.int64)  # Caffe's static_cast<int> (values are integral)
        idx = torch.where((idx < 0) | (idx >= size), torch.full_like(idx, size), idx)
        # the source position that writes each output element last (Caffe's order), then gather
        src = torch.arange(h * w, device=x.device).expand(n, c, h * w)
        last = torch.full((n, c, size + 1), -1, dtype=torch.int64, device=x.device)
        last = last.scatter_reduce(2, idx, src, reduce="amax", include_self=True)[:, :, :size]
        vals = x.reshape(n, c, h * w).gather(2, last.clamp(min=0))
        out = torch.where(last >= 0, vals, torch.zeros((), dtype=x.dtype, device=x.device))
        return out.reshape(n, c, oh, ow)

    def extra_repr(self) -> str:
        if not self.unpool:
            return f"name={self.caffe_name!r}, nearest, scale={self.scale}"
        size = self.out_hw if self.out_hw is not None else f"scale={list(self.scale_hw)}, pad_out={list(self.pad_out)}"
        return f"name={self.caffe_name!r}, unpool, {size}"
