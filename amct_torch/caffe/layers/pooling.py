"""Caffe Pooling with Caffe's exact output size and window rules.

Caffe rounds the output size up by default (``round_mode: CEIL``; the forks' ``ceil_mode:
false`` is FLOOR), drops a last window that would start at or beyond H + pad when pad > 0,
accepts pad up to kernel-1 (torch refuses more than kernel/2) and divides AVE sums by the
window clipped to H + pad (padding counts, the ceil overhang does not). torch's own pooling
is used when it gives the same answer, an explicit pad + pool otherwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from amct_torch.caffe.layers.base import CaffeLayer, register
from amct_torch.caffe.layers.conv import _hw
from amct_torch.caffe.layers.upsample import max_pool_with_mask
from amct_torch.caffe.quant_types import POOL_AVE

MAX, AVE, STOCHASTIC = 0, POOL_AVE, 2


def caffe_pooled_size(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    """Caffe's PoolingLayer::Reshape output length along one axis."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if p > 0 and (out - 1) * s >= size + p:
        out -= 1
    return out


def _torch_pooled_size(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _max_pool2d(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
                pad: tuple[int, int] = (0, 0), ceil: bool = False) -> torch.Tensor:
    """torch's max_pool2d, faster on CPU for a plain (NCHW-contiguous) input with 8+ channels:
    non-overlapping windows that tile the input (VGG's 2x2 stride 2) as elementwise maxima of
    strided views, rows then columns, and other windows through a channels-last copy handed
    back in NCHW -- torch's CPU NCHW max-pool kernel is several times slower than either (a
    VGG-16 batch of 8: 0.70 s in its five pools through the copies, 0.21 s as maxima). Max is
    exact and both ways propagate NaN, so the values are the same bits; the maxima would split
    the gradient of a tie where torch gives it to one element, so under autograd the tiles go
    the channels-last way."""
    if (x.device.type == "cpu" and x.dim() == 4 and x.shape[1] >= 8 and x.is_contiguous()
            and not x.is_contiguous(memory_format=torch.channels_last)):
        if _tiles(x, kernel, stride, pad) and not (x.requires_grad and torch.is_grad_enabled()):
            return _tiled_max(x, kernel)  # values only: ties would share torch's gradient
        y = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel, stride, pad, ceil_mode=ceil)
        return y.contiguous()
    return F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil)


def _tiles(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int]) -> bool:
    """The windows are the input cut into whole kernel-sized tiles: stride = kernel, no pad,
    and the kernel divides H and W (so ceil and floor rounding give the same output)."""
    (kh, kw), (h, w) = kernel, x.shape[-2:]
    return tuple(stride) == (kh, kw) and tuple(pad) == (0, 0) and 1 <= kh <= h and 1 <= kw <= w \
        and h % kh == 0 and w % kw == 0 and kh * kw > 1


def _tiled_max(x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
    """Max over non-overlapping kh x kw tiles: the rows of each tile first, then its columns."""
    kh, kw = kernel
    rows = x[:, :, 0::kh]
    for i in range(1, kh):
        rows = torch.maximum(rows, x[:, :, i::kh])
    out = rows[..., 0::kw]
    for j in range(1, kw):
        out = torch.maximum(out, rows[..., j::kw])
    return out.contiguous()


def _divisor(size: int, out: int, k: int, s: int, p: int, device) -> torch.Tensor:
    start = torch.arange(out, device=device) * s - p
    end = torch.clamp(start + k, max=size + p)
    return torch.clamp(end - start, min=1).to(torch.float32)


def caffe_pool2d(x: torch.Tensor, method: int, kernel: tuple[int, int], stride: tuple[int, int],
                 pad: tuple[int, int], ceil: bool = True) -> torch.Tensor:
    """2-D pooling over the last two axes of ``x`` exactly as Caffe's PoolingLayer computes it."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = caffe_pooled_size(h, kh, sh, ph, ceil), caffe_pooled_size(w, kw, sw, pw, ceil)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"pooling a {h}x{w} input with kernel {kh}x{kw}, pad {ph}x{pw} gives no output")
    if method in (MAX, AVE) and ph <= kh // 2 and pw <= kw // 2 \
            and _torch_pooled_size(h, kh, sh, ph, ceil) == oh and _torch_pooled_size(w, kw, sw, pw, ceil) == ow:
        if method == MAX:
            return _max_pool2d(x, (kh, kw), (sh, sw), (ph, pw), ceil)
        return F.avg_pool2d(x, (kh, kw), (sh, sw), (ph, pw), ceil_mode=ceil, count_include_pad=True)
    if method == STOCHASTIC:  # Caffe's test-time stochastic pooling ignores pad in the windows
        ph = pw = 0
    rh = max(0, (oh - 1) * sh + kh - h - ph)
    rw = max(0, (ow - 1) * sw + kw - w - pw)
    if method == MAX:
        xp = F.pad(x, (pw, rw, ph, rh), value=torch.finfo(x.dtype).min)  # Caffe starts at -FLT_MAX
        return _max_pool2d(xp, (kh, kw), (sh, sw))[..., :oh, :ow]
    xp = F.pad(x, (pw, rw, ph, rh))
    if method == STOCHASTIC:
        sx = F.avg_pool2d(xp, (kh, kw), (sh, sw), divisor_override=1)[..., :oh, :ow]
        sxx = F.avg_pool2d(xp * xp, (kh, kw), (sh, sw), divisor_override=1)[..., :oh, :ow]
        return torch.where(sx > 0, sxx / torch.where(sx > 0, sx, torch.ones_like(sx)), torch.zeros_like(sx))
    total = F.avg_pool2d(xp, (kh, kw), (sh, sw), divisor_override=1)[..., :oh, :ow]
    div = _divisor(h, oh, kh, sh, ph, x.device)[:, None] * _divisor(w, ow, kw, sw, pw, x.device)[None, :]
    return total / div.to(x.dtype)


@register("Pooling")
class PoolingLayer(CaffeLayer):
    """Caffe Pooling (MAX, AVE; STOCHASTIC with Caffe's test-time rule sum(x^2)/sum(x)).

    ``quantizable`` is True for AVE pooling that is not global (as in AMCT). MAX pooling may
    have BVLC's second top, the argmax mask (``upsample.max_pool_with_mask``) SegNet unpools with."""

    per_sample = True
    tops = (1, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.pooling_param
        self.method = int(p.pool)
        if self.method not in (MAX, AVE, STOCHASTIC):
            self.fail(f"unknown pool method {self.method}")
        if self.num_tops == 2 and self.method != MAX:
            self.fail("only MAX pooling has a second top (the argmax mask)")
        self.global_pooling = bool(p.global_pooling)
        self.ceil = p.round_mode == 0
        if p.HasField("ceil_mode"):  # the forks' spelling (OpenCV, shicai's DenseNet)
            if p.HasField("round_mode") and bool(p.ceil_mode) != self.ceil:
                self.fail("round_mode and ceil_mode disagree (ceil_mode false is round_mode FLOOR)")
            self.ceil = bool(p.ceil_mode)
        self.padding = _hw(self, p, "pad", "pad_h", "pad_w", 0)
        self.stride = _hw(self, p, "stride", "stride_h", "stride_w", 1)
        if self.global_pooling:
            if any(self.padding) or any(s != 1 for s in self.stride):
                self.fail("global pooling requires pad 0 and stride 1")
            self.kernel_size = None
        else:
            if not (p.HasField("kernel_size") or p.HasField("kernel_h")):
                self.fail("kernel_size (or kernel_h and kernel_w) is required unless global_pooling")
            self.kernel_size = _hw(self, p, "kernel_size", "kernel_h", "kernel_w", None)
            if min(self.kernel_size) < 1 or min(self.stride) < 1:
                self.fail("kernel and stride must be >= 1")
            if self.padding[0] >= self.kernel_size[0] or self.padding[1] >= self.kernel_size[1]:
                self.fail(f"pad {self.padding} must be smaller than kernel {self.kernel_size}")

    @property
    def quantizable(self) -> bool:
        return self.method == AVE and not self.global_pooling

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) < 3:
            self.fail(f"Pooling needs an input with spatial axes, got {list(s)}")
        if self.global_pooling:
            return [tuple(s[:-2]) + (1, 1)] * self.num_tops
        (kh, kw), (sh, sw), (ph, pw) = self._window(), self.stride, self.padding
        oh = caffe_pooled_size(s[-2], kh, sh, ph, self.ceil)
        ow = caffe_pooled_size(s[-1], kw, sw, pw, self.ceil)
        if oh <= 0 or ow <= 0:
            self.fail(f"input {list(s)} is too small for kernel {self.kernel_size}")
        return [tuple(s[:-2]) + (oh, ow)] * self.num_tops

    def forward(self, x: torch.Tensor):
        if self.num_tops == 2:
            k = (x.shape[-2], x.shape[-1]) if self.global_pooling else self._window()
            st, pd = ((1, 1), (0, 0)) if self.global_pooling else (self.stride, self.padding)
            oh, ow = (caffe_pooled_size(n, kk, ss, pp, self.ceil) for n, kk, ss, pp in zip(x.shape[-2:], k, st, pd))
            return max_pool_with_mask(x, k, st, pd, (oh, ow))
        if self.global_pooling:
            if self.method == MAX:
                return torch.amax(x, dim=(-2, -1), keepdim=True)
            if self.method == AVE:
                return torch.mean(x, dim=(-2, -1), keepdim=True)
            return caffe_pool2d(x, STOCHASTIC, (x.shape[-2], x.shape[-1]), (1, 1), (0, 0), self.ceil)
        return caffe_pool2d(x, self.method, self._window(), self.stride, self.padding, self.ceil)

    def _window(self) -> tuple[int, int]:
        """The kernel (H, W) of a pooling that is not global."""
        assert self.kernel_size is not None  # set in setup unless global_pooling
        return self.kernel_size

    def extra_repr(self) -> str:
        m = {MAX: "MAX", AVE: "AVE", STOCHASTIC: "STOCHASTIC"}[self.method]
        if self.global_pooling:
            return f"name={self.caffe_name!r}, {m}, global"
        return (f"name={self.caffe_name!r}, {m}, kernel={self.kernel_size}, stride={self.stride}, "
                f"pad={self.padding}, {'ceil' if self.ceil else 'floor'}")
