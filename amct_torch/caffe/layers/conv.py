"""Weighted layers: Convolution, Deconvolution and InnerProduct (the quantizable ones).

Weights live in torch's layout, which for these three is also Caffe's: conv (C_out, C_in/g,
kh, kw), deconv (C_in, C_out/g, kh, kw), InnerProduct (N, K) (Caffe's ``transpose: true`` stores
(K, N); we keep (N, K) and transpose back in ``caffe_blobs``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from amct_torch.caffe.layers.base import CaffeLayer, canonical_axis, register, to_numpy
from amct_torch.caffe.layers.integer import integer_blobs, set_integer


def _hw(layer: CaffeLayer, param, rep: str, h: str, w: str, default: Optional[int]) -> tuple[int, int]:
    """A 2-D spatial setting from Caffe's two spellings: ``x_h``/``x_w`` or repeated ``x``."""
    if param.HasField(h) or param.HasField(w):
        if not (param.HasField(h) and param.HasField(w)):
            layer.fail(f"{h} and {w} must be given together")
        return int(getattr(param, h)), int(getattr(param, w))
    field = param.DESCRIPTOR.fields_by_name[rep]
    values = list(getattr(param, rep)) if field.is_repeated else ([getattr(param, rep)] if param.HasField(rep) else [])
    if not values:
        if default is None:
            layer.fail(f"{rep} is required")
        return default, default
    if len(values) == 1:
        return int(values[0]), int(values[0])
    if len(values) == 2:
        return int(values[0]), int(values[1])
    layer.fail(f"{rep} has {len(values)} values; only 2-D spatial layers are supported")


#: Caffe's fillers of a convolution's or an InnerProduct's blobs (weight: none = refused)
_CONV_FILLERS = (("weight_filler", None), ("bias_filler", 0.0))


class WeightedLayer(CaffeLayer):
    """The traits a convolution and an InnerProduct share: a quantized weight (+ bias) in
    ``weight_param`` (``caffe/quant_types.py``), filled by ``_CONV_FILLERS``."""

    fresh_output = True
    per_sample = True
    fold_bn_after = True
    int_bias: Optional[torch.Tensor]  # a deploy layer's exact int32 bias (integer.set_integer)


class _ConvBase(WeightedLayer):
    transposed = False
    fillers = ("convolution_param", _CONV_FILLERS)

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.convolution_param
        if p.axis != 1:
            self.fail(f"{self.caffe_type} axis {p.axis} is not supported (only 1)")
        if p.num_output <= 0:
            self.fail("num_output must be > 0")
        self.num_output = int(p.num_output)
        self.kernel_size = _hw(self, p, "kernel_size", "kernel_h", "kernel_w", None)
        self.stride = _hw(self, p, "stride", "stride_h", "stride_w", 1)
        self.padding = _hw(self, p, "pad", "pad_h", "pad_w", 0)
        dil = list(p.dilation)
        if len(dil) > 2:
            self.fail("only 2-D dilation is supported")
        self.dilation = (1, 1) if not dil else ((dil[0], dil[0]) if len(dil) == 1 else (dil[0], dil[1]))
        self.groups = int(p.group)
        if self.groups < 1 or self.num_output % self.groups:
            self.fail(f"num_output {self.num_output} is not divisible by group {self.groups}")
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.dilation) < 1:
            self.fail("kernel, stride and dilation must be >= 1")
        has_bias = bool(p.bias_term)
        self.expect_blob_count(blobs, 1 + has_bias, 1 + has_bias)
        cin = None
        if bottom_shapes is not None and len(bottom_shapes[0]) == 4:
            cin = bottom_shapes[0][1]
            if cin % self.groups:
                self.fail(f"input channels {cin} not divisible by group {self.groups}")
        kh, kw = self.kernel_size
        if blobs is None:
            if cin is None:
                self.fail("no weights and no input shape to size them")
            wshape = (cin, self.num_output // self.groups, kh, kw) if self.transposed \
                else (self.num_output, cin // self.groups, kh, kw)
            weight = torch.zeros(wshape)
            bias = torch.zeros(self.num_output) if has_bias else None
        else:
            weight = self._weight_from_blob(blobs[0], cin)
            bias = self.blob_as(blobs[1], (self.num_output,), "bias") if has_bias else None
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        set_integer(self, blobs, has_bias)

    def _weight_from_blob(self, blob: np.ndarray, cin: Optional[int]) -> torch.Tensor:
        kh, kw = self.kernel_size
        g = self.groups
        if self.transposed:  # (C_in, C_out/g, kh, kw)
            per = (self.num_output // g) * kh * kw
            first = cin if cin is not None else (blob.size // per if blob.size % per == 0 else -1)
            shape = (first, self.num_output // g, kh, kw)
        else:  # (C_out, C_in/g, kh, kw)
            per = self.num_output * kh * kw
            second = cin // g if cin is not None else (blob.size // per if blob.size % per == 0 else -1)
            shape = (self.num_output, second, kh, kw)
        if min(shape) <= 0:
            self.fail(f"weight blob has {blob.size} elements (shape {list(blob.shape)}), which does not "
                      f"fit num_output {self.num_output}, kernel {kh}x{kw}, group {g}")
        return self.blob_as(blob, shape, "weight", strict_4d=True)

    def caffe_blobs(self) -> list[np.ndarray]:
        if self.integer:
            return integer_blobs(self)
        out = [to_numpy(self.weight)]
        if self.bias is not None:
            out.append(to_numpy(self.bias))
        return out

    def extra_repr(self) -> str:
        return (f"name={self.caffe_name!r}, weight={list(self.weight.shape)}, stride={self.stride}, "
                f"pad={self.padding}, dilation={self.dilation}, group={self.groups}, "
                f"bias={self.bias is not None}")


@register("Convolution")
class ConvolutionLayer(_ConvBase):
    """Caffe Convolution: symmetric pad, stride, dilation, group; out = floor((H+2p-dk)/s)+1."""

    fold_scale_before = True

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) != 4:
            self.fail(f"Convolution needs a 4-D input, got {list(s)}")
        if s[1] != self.weight.shape[1] * self.groups:
            self.fail(f"input has {s[1]} channels, the weight expects {self.weight.shape[1] * self.groups}")
        out = []
        for size, k, st, p, d in zip(s[2:], self.kernel_size, self.stride, self.padding, self.dilation):
            o = (size + 2 * p - (d * (k - 1) + 1)) // st + 1
            if o <= 0:
                self.fail(f"input {list(s)} is too small for kernel {self.kernel_size}")
            out.append(o)
        return [(s[0], self.num_output, out[0], out[1])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.integer:
            return F.conv2d(x.double(), self.weight.double(), self.int_bias, self.stride, self.padding,
                            self.dilation, self.groups)
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


@register("Deconvolution")
class DeconvolutionLayer(_ConvBase):
    """Caffe Deconvolution: out = s(H-1) + d(k-1) + 1 - 2p, as torch's conv_transpose2d."""

    transposed = True

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) != 4:
            self.fail(f"Deconvolution needs a 4-D input, got {list(s)}")
        if s[1] != self.weight.shape[0]:
            self.fail(f"input has {s[1]} channels, the weight expects {self.weight.shape[0]}")
        out = []
        for size, k, st, p, d in zip(s[2:], self.kernel_size, self.stride, self.padding, self.dilation):
            o = st * (size - 1) + d * (k - 1) + 1 - 2 * p
            if o <= 0:
                self.fail(f"input {list(s)} gives an empty output with kernel {self.kernel_size}, pad {self.padding}")
            out.append(o)
        return [(s[0], self.weight.shape[1] * self.groups, out[0], out[1])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.integer:
            return F.conv_transpose2d(x.double(), self.weight.double(), self.int_bias, self.stride,
                                      self.padding, 0, self.groups, self.dilation)
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, 0,
                                  self.groups, self.dilation)


@register("InnerProduct")
class InnerProductLayer(WeightedLayer):
    """Caffe InnerProduct: flatten from ``axis`` and y = x W^T + b, W kept as (N, K)."""

    fillers = ("inner_product_param", _CONV_FILLERS)

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.inner_product_param
        if p.num_output <= 0:
            self.fail("num_output must be > 0")
        self.num_output = int(p.num_output)
        self.axis = int(p.axis)
        self.transpose = bool(p.transpose)
        has_bias = bool(p.bias_term)
        self.expect_blob_count(blobs, 1 + has_bias, 1 + has_bias)
        k = None
        if bottom_shapes is not None:
            s = bottom_shapes[0]
            ax = canonical_axis(self.axis, len(s), self)
            k = int(np.prod(s[ax:], dtype=np.int64))
        n = self.num_output
        if blobs is None:
            if k is None:
                self.fail("no weights and no input shape to size them")
            weight = torch.zeros(n, k)
            bias = torch.zeros(n) if has_bias else None
        else:
            size = blobs[0].size
            if k is None:
                if size % n:
                    self.fail(f"weight blob has {size} elements, not a multiple of num_output {n}")
                k = size // n
            self._check_weight_shape(blobs[0].shape, n, k)
            if self.transpose:
                weight = self.blob_as(blobs[0], (k, n), "weight").t().contiguous()
            else:
                weight = self.blob_as(blobs[0], (n, k), "weight")
            bias = self.blob_as(blobs[1], (n,), "bias") if has_bias else None
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        set_integer(self, blobs, has_bias)

    def _check_weight_shape(self, shape: tuple[int, ...], n: int, k: int) -> None:
        """Caffe's own check: the weight blob is (N, K), or (K, N) with ``transpose: true``,
        or the legacy 4-D (1, 1, rows, cols); a (K, N) blob without transpose would otherwise
        be read, by element count, as a different matrix."""
        want = (k, n) if self.transpose else (n, k)
        dims = tuple(int(d) for d in shape)
        if len(dims) == 4 and dims[:2] == (1, 1):
            dims = dims[2:]
        if len(dims) == 2 and dims != want:
            layout = "(K, N) with transpose: true" if self.transpose else "(N, K) = (num_output, inputs)"
            self.fail(f"weight blob has shape {list(shape)}, expected {list(want)}: InnerProduct "
                      f"weights are {layout}")

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        ax = canonical_axis(self.axis, len(s), self)
        k = int(np.prod(s[ax:], dtype=np.int64))
        if k != self.weight.shape[1]:
            self.fail(f"input {list(s)} gives {k} features from axis {self.axis}, the weight expects "
                      f"{self.weight.shape[1]}")
        return [tuple(s[:ax]) + (self.num_output,)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ax = self.axis % x.dim()
        if ax != x.dim() - 1:
            x = x.flatten(ax)
        if self.integer:
            return F.linear(x.double(), self.weight.double(), self.int_bias)
        return F.linear(x, self.weight, self.bias)

    def caffe_blobs(self) -> list[np.ndarray]:
        if self.integer:
            return integer_blobs(self)
        w = to_numpy(self.weight)
        out = [np.ascontiguousarray(w.T) if self.transpose else w]
        if self.bias is not None:
            out.append(to_numpy(self.bias))
        return out

    def extra_repr(self) -> str:
        return (f"name={self.caffe_name!r}, weight={list(self.weight.shape)}, axis={self.axis}, "
                f"transpose={self.transpose}, bias={self.bias is not None}")
