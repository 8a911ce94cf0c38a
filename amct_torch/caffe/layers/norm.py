"""Normalisation and per-channel affine layers: BatchNorm, Scale, Bias, LRN, Normalize (SSD).

BatchNorm keeps mean/var already divided by Caffe's scale-factor blob (so fusion reads plain
statistics) and writes them back with a factor of 1. Scale and Bias keep their parameters flat
and view them over ``axis``/``num_axes`` of the input at run time, so any input rank works.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from amct_torch.caffe.layers.base import CaffeLayer, canonical_axis, register, to_numpy
from amct_torch.caffe.layers.pooling import AVE, caffe_pool2d


def _channels(bottom_shapes) -> Optional[int]:
    if bottom_shapes is None or len(bottom_shapes[0]) < 2:
        return None
    return bottom_shapes[0][1]


@register("BatchNorm")
class BatchNormLayer(CaffeLayer):
    """Caffe BatchNorm at test: y = (x - mean) / sqrt(var + eps) over axis 1, no affine part.

    Buffers ``mean`` and ``var`` are the caffemodel's b0/s and b1/s (s == 0 -> 0).
    ``use_global_stats: false`` given explicitly makes Caffe normalise with the batch's own
    statistics even at test time; that is honoured (``uses_batch_stats``)."""

    per_sample = True
    same_shape = True
    can_run_inplace = True
    fresh_output = True
    mean: torch.Tensor  # buffers
    var: torch.Tensor

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.batch_norm_param
        self.eps = float(p.eps)
        if not self.eps >= 0:
            self.fail(f"eps {self.eps} is negative: 1/sqrt(var + eps) would be NaN")
        self.uses_batch_stats = p.HasField("use_global_stats") and not p.use_global_stats
        self.expect_blob_count(blobs, 3, 3)
        if blobs is None:
            c = _channels(bottom_shapes)
            if c is None:
                self.fail("no weights and no input shape to size them")
            mean, var = torch.zeros(c), torch.ones(c)
        else:
            c = blobs[0].size
            mean = self.blob_as(blobs[0], (c,), "mean")
            var = self.blob_as(blobs[1], (c,), "variance")
            s = self.blob_as(blobs[2], (1,), "scale factor")[0].item()
            if _channels(bottom_shapes) not in (None, c):
                self.fail(f"mean blob has {c} elements, the input has {_channels(bottom_shapes)} channels")
            f = 0.0 if s == 0 else 1.0 / s
            mean, var = mean * f, var * f
            self._check_variance(var, s)
        self.register_buffer("mean", mean)
        self.register_buffer("var", var)

    def _check_variance(self, var: torch.Tensor, factor: float) -> None:
        """The stored statistics must give a finite 1/sqrt(var + eps) at every channel: a
        negative variance (or scale factor) or a zero one with eps 0 would turn every
        activation after this layer into NaN or Inf, blamed on the data at run time."""
        if self.uses_batch_stats:
            return
        bad = torch.nonzero(~(var + self.eps > 0)).flatten()
        if bad.numel():
            c = int(bad[0])
            if factor < 0:
                why = f"the moving-average factor blob (blob 2) is {factor:g}"
            elif factor == 0:
                why = "the moving-average factor blob (blob 2) is 0, so Caffe uses variance 0"
            else:
                why = f"the variance blob holds {float(var[c]) * factor:g} at channel {c}"
            self.fail(f"{why}: with eps {self.eps:g}, var + eps is not positive "
                      f"({bad.numel()} channel(s)), so 1/sqrt(var + eps) is NaN or Inf")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        view = (1, -1) + (1,) * (x.dim() - 2)
        if self.uses_batch_stats:
            dims = [0] + list(range(2, x.dim()))
            mean = x.mean(dim=dims)
            var = ((x - mean.view(view)) ** 2).mean(dim=dims)
        else:
            mean, var = self.mean, self.var
        inv = torch.rsqrt(var + self.eps)
        shift, mul = (-mean * inv).view(view), inv.view(view)
        # mul then add rather than addcmul: on CPU torch's broadcast addcmul is about twice as
        # slow as the two passes, and it rounds the same way (product, then sum)
        if self.may_overwrite(x):
            return x.mul_(mul).add_(shift)
        return torch.mul(x, mul).add_(shift)

    def caffe_blobs(self) -> list[np.ndarray]:
        return [to_numpy(self.mean), to_numpy(self.var), np.ones(1, np.float32)]

    def extra_repr(self) -> str:
        return f"name={self.caffe_name!r}, channels={self.mean.numel()}, eps={self.eps}"


class _AffineBase(CaffeLayer):
    """Shared by Scale and Bias: a parameter spanning input axes [axis, axis + num_axes)."""

    bottoms = (1, 2)
    can_run_inplace = True
    fresh_output = True
    axis: int
    num_axes: int

    def _param_axes(self, x: torch.Tensor, p_shape_ndim: int) -> tuple[int, int]:
        ax = canonical_axis(self.axis, x.dim(), self)
        return ax, ax + p_shape_ndim

    def _view(self, x: torch.Tensor, p: torch.Tensor, ndim: int) -> torch.Tensor:
        ax, end = self._param_axes(x, ndim)
        if end > x.dim():
            self.fail(f"axis {self.axis} + {ndim} parameter axes exceed the {x.dim()}-D input")
        want = x.shape[ax:end]
        if p.numel() != int(np.prod(want, dtype=np.int64)):
            self.fail(f"parameter of {p.numel()} elements does not match input axes {list(want)}")
        return p.reshape((1,) * ax + tuple(want) + (1,) * (x.dim() - end))

    def _param_ndim(self, x: torch.Tensor) -> int:
        if self.num_axes == -1:
            return x.dim() - canonical_axis(self.axis, x.dim(), self)
        return self.num_axes

    def _param_count(self, bottom_shapes) -> Optional[int]:
        """Element count of the parameter from the input shape (also remembers Caffe's blob shape)."""
        self._pshape = None
        if bottom_shapes is None:
            return None
        s = bottom_shapes[0]
        ax = canonical_axis(self.axis, len(s), self)
        end = len(s) if self.num_axes == -1 else ax + self.num_axes
        self._pshape = tuple(s[ax:end])
        return int(np.prod(s[ax:end], dtype=np.int64))

    def infer_shapes(self, bottom_shapes):
        """The output has the first input's shape; the parameter (blob, or the second bottom)
        must span input axes [axis, axis + its axes): the checks ``_view`` makes at run time,
        made here without running the layer (a meta-device forward costs torch a second of
        imports on first use)."""
        s = bottom_shapes[0]
        params = [t for t in (getattr(self, "weight", None), self.bias) if t is not None]
        if len(bottom_shapes) == 2:
            nd = len(bottom_shapes[1])
            counts = [int(np.prod(bottom_shapes[1], dtype=np.int64))] + [t.numel() for t in params]
        else:
            nd = len(s) - canonical_axis(self.axis, len(s), self) if self.num_axes == -1 else self.num_axes
            counts = [t.numel() for t in params]
        ax = canonical_axis(self.axis, len(s), self)
        if ax + nd > len(s):
            self.fail(f"axis {self.axis} + {nd} parameter axes exceed the {len(s)}-D input")
        want = int(np.prod(s[ax:ax + nd], dtype=np.int64))
        for c in counts:
            if c != want:
                self.fail(f"parameter of {c} elements does not match input axes {list(s[ax:ax + nd])}")
        return [tuple(s)]

    def _caffe_shape(self, t: torch.Tensor) -> np.ndarray:
        a = to_numpy(t)
        shape = getattr(self, "_pshape", None)
        return a.reshape(shape) if shape is not None and int(np.prod(shape)) == a.size else a


def _fits(p: torch.Tensor, x: torch.Tensor) -> bool:
    """True when broadcasting ``p`` against ``x`` gives x's shape (so x can take the result)."""
    return p.dim() <= x.dim() and all(a == 1 or a == b for a, b in zip(p.shape[::-1], x.shape[::-1]))


@register("Scale")
class ScaleLayer(_AffineBase):
    """Caffe Scale: y = x * gamma (+ beta), gamma from the blobs or, with two bottoms, the second
    bottom. ``weight`` is gamma (flat, None with two bottoms), ``bias`` is beta (flat) or None."""

    per_sample = True
    fillers = ("scale_param", (("filler", 1.0), ("bias_filler", 0.0)))

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.scale_param
        self.axis, self.num_axes = int(p.axis), int(p.num_axes)
        if self.num_axes < -1:
            self.fail("num_axes must be >= -1")
        two = len(self.layer_param.bottom) == 2
        has_bias = bool(p.bias_term)
        n_blobs = (0 if two else 1) + has_bias
        self.expect_blob_count(blobs, n_blobs, n_blobs)
        count = self._param_count(bottom_shapes) if not two else None
        if blobs is None:
            if two:
                s = bottom_shapes[1] if bottom_shapes is not None else None
                count = None if s is None else int(np.prod(s, dtype=np.int64))
            gamma = None if two else torch.ones(self._sized(count))
            beta = torch.zeros(self._sized(count)) if has_bias else None
        else:
            gamma = None if two else torch.from_numpy(np.asarray(blobs[0], np.float32).reshape(-1).copy())
            beta = torch.from_numpy(np.asarray(blobs[-1], np.float32).reshape(-1).copy()) if has_bias else None
            if gamma is not None and count is not None and gamma.numel() != count:
                self.fail(f"scale blob has {gamma.numel()} elements, the input axes hold {count}")
            if beta is not None and gamma is not None and beta.numel() != gamma.numel():
                self.fail(f"bias blob has {beta.numel()} elements, the scale blob {gamma.numel()}")
        if gamma is None:  # gamma is the second bottom
            self.register_parameter("weight", None)
        else:
            self.weight = nn.Parameter(gamma)
        self.bias = None if beta is None else nn.Parameter(beta)

    def _sized(self, count: Optional[int]) -> int:
        """The parameter's element count, which a layer without blobs takes from its input."""
        if count is None:
            self.fail("no weights and no input shape to size them")
        return count

    @property
    def gamma(self) -> Optional[torch.Tensor]:
        return self.weight

    @property
    def beta(self) -> Optional[torch.Tensor]:
        return self.bias

    def forward(self, x: torch.Tensor, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if scale is None:
            g = self._view(x, self.weight, self._param_ndim(x))
            nd = self._param_ndim(x)
        else:
            nd = scale.dim()
            g = self._view(x, scale, nd)
        if self.bias is None:
            return x.mul_(g) if self.may_overwrite(x) and _fits(g, x) else x * g
        b = self._view(x, self.bias, nd)
        if self.may_overwrite(x) and _fits(g, x) and _fits(b, x):
            return x.mul_(g).add_(b)  # see BatchNormLayer.forward for why not addcmul
        y = torch.mul(x, g)
        return y.add_(b) if _fits(b, y) else y + b

    def caffe_blobs(self) -> list[np.ndarray]:
        out = [] if self.weight is None else [self._caffe_shape(self.weight)]
        if self.bias is not None:
            out.append(self._caffe_shape(self.bias) if self.weight is not None else to_numpy(self.bias))
        return out

    def extra_repr(self) -> str:
        n = "bottom[1]" if self.weight is None else str(self.weight.numel())
        return f"name={self.caffe_name!r}, scale={n}, axis={self.axis}, bias={self.bias is not None}"


@register("Bias")
class BiasLayer(_AffineBase):
    """Caffe Bias: y = x + b, b from the blob or the second bottom."""

    per_sample = True
    fillers = ("bias_param", (("filler", 0.0),))

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.bias_param
        self.axis, self.num_axes = int(p.axis), int(p.num_axes)
        two = len(self.layer_param.bottom) == 2
        self.expect_blob_count(blobs, 0 if two else 1, 0 if two else 1)
        if two:
            self.bias = None
            return
        count = self._param_count(bottom_shapes)
        if blobs is None:
            if count is None:
                self.fail("no weights and no input shape to size them")
            b = torch.zeros(count)
        else:
            b = torch.from_numpy(np.asarray(blobs[0], np.float32).reshape(-1).copy())
            if count is not None and b.numel() != count:
                self.fail(f"bias blob has {b.numel()} elements, the input axes hold {count}")
        self.bias = nn.Parameter(b)

    def forward(self, x: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
        if b is None:
            assert self.bias is not None  # one bottom: the blob is the bias
            b = self._view(x, self.bias, self._param_ndim(x))
        else:
            b = self._view(x, b, b.dim())
        return x.add_(b) if self.may_overwrite(x) and _fits(b, x) else x + b

    def caffe_blobs(self) -> list[np.ndarray]:
        return [] if self.bias is None else [self._caffe_shape(self.bias)]


@register("LRN")
class LRNLayer(CaffeLayer):
    """Caffe LRN. ACROSS_CHANNELS: x * (k + alpha/n * sum_window x^2)^-beta over n channels
    centred on c; WITHIN_CHANNEL: x * (1 + alpha * avg_nxn(x^2))^-beta with Caffe's AVE pooling
    (pad (n-1)/2, padding counted in the divisor)."""

    per_sample = True
    same_shape = True
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.lrn_param
        self.size, self.alpha, self.beta, self.k = int(p.local_size), float(p.alpha), float(p.beta), float(p.k)
        self.within = p.norm_region == 1
        if self.size % 2 == 0 and not self.within:
            self.fail("LRN only supports odd values for local_size")
        if self.size < 1:
            self.fail("local_size must be >= 1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sq = x * x
        pre = (self.size - 1) // 2
        if self.within:
            avg = caffe_pool2d(sq, AVE, (self.size, self.size), (1, 1), (pre, pre), True)
            return x * torch.pow(1.0 + self.alpha * avg, -self.beta)
        s = F.avg_pool3d(sq.unsqueeze(1), (self.size, 1, 1), 1, (pre, 0, 0), count_include_pad=True).squeeze(1)
        return x * torch.pow(self.k + self.alpha * s, -self.beta)


@register("Normalize")
class NormalizeLayer(CaffeLayer):
    """SSD Normalize: x / sqrt(sum x^2 + eps) over C,H,W (across_spatial) or over C at each
    position, times a learned scale (one value if channel_shared, else per channel)."""

    fillers = ("norm_param", (("scale_filler", 1.0),))
    same_shape = True
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.norm_param
        self.across_spatial = bool(p.across_spatial)
        self.channel_shared = bool(p.channel_shared)
        self.eps = float(p.eps)
        self.expect_blob_count(blobs, 1, 1)
        n = 1 if self.channel_shared else _channels(bottom_shapes)
        if blobs is None:
            if n is None:
                self.fail("no weights and no input shape to size them")
            w = torch.ones(n)
        else:
            w = torch.from_numpy(np.asarray(blobs[0], np.float32).reshape(-1).copy())
            if self.channel_shared and w.numel() != 1:
                self.fail(f"channel_shared scale blob must have 1 element, has {w.numel()}")
            if n is not None and w.numel() != n:
                self.fail(f"scale blob has {w.numel()} elements, the input has {n} channels")
        self.weight = nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(1, x.dim())) if self.across_spatial else (1,)
        norm = torch.sqrt((x * x).sum(dim=dims, keepdim=True) + self.eps)
        w = self.weight.view((1, -1) + (1,) * (x.dim() - 2)) if not self.channel_shared else self.weight
        return x / norm * w

    def caffe_blobs(self) -> list[np.ndarray]:
        return [to_numpy(self.weight)]
