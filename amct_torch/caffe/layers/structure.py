"""Layers that move, combine or select data: Eltwise, Concat, Slice, Split, Flatten, Reshape,
Permute, Crop, Softmax, ArgMax, Dropout, Silence — with Caffe's axis conventions."""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from amct_torch.caffe.layers.base import CaffeLayer, canonical_axis, register

PROD, SUM, MAX = 0, 1, 2


@register("Eltwise")
class EltwiseLayer(CaffeLayer):
    """PROD, SUM (optionally weighted by ``coeff``, one per bottom) or MAX of same-shape inputs."""

    per_sample = True
    bottoms = (2, None)
    can_run_inplace = True
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.eltwise_param
        self.operation = int(p.operation)
        if self.operation not in (PROD, SUM, MAX):
            self.fail(f"unknown Eltwise operation {self.operation}")
        coeff = [float(c) for c in p.coeff]
        if coeff and len(coeff) != len(self.layer_param.bottom):
            self.fail(f"Eltwise has {len(coeff)} coeff for {len(self.layer_param.bottom)} bottoms")
        if coeff and self.operation != SUM:
            self.fail("Eltwise coeff is only allowed for SUM")
        self.coeff = None if not coeff or all(c == 1.0 for c in coeff) else coeff

    def infer_shapes(self, bottom_shapes):
        if any(s != bottom_shapes[0] for s in bottom_shapes[1:]):
            self.fail(f"Eltwise inputs differ in shape: {[list(s) for s in bottom_shapes]}")
        return [bottom_shapes[0]]

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        for x in xs[1:]:
            if x.shape != xs[0].shape:
                self.fail(f"Eltwise inputs differ in shape: {list(xs[0].shape)} vs {list(x.shape)}")
        first = xs[0] if self.may_overwrite(xs[0]) else None  # accumulate into bottom 0
        if self.operation == SUM:
            if self.coeff is None:
                y = torch.add(xs[0], xs[1], out=first)
                for x in xs[2:]:
                    y = y.add_(x)
                return y
            y = torch.mul(xs[0], self.coeff[0], out=first)
            for c, x in zip(self.coeff[1:], xs[1:]):
                y = y.add_(x, alpha=c)
            return y
        op = torch.mul if self.operation == PROD else torch.maximum
        y = op(xs[0], xs[1], out=first)
        for x in xs[2:]:
            y = op(y, x, out=y)
        return y


@register("Concat")
class ConcatLayer(CaffeLayer):
    """Concatenate along ``axis`` (legacy ``concat_dim`` if that is what the file gives)."""

    per_sample = True
    bottoms = (1, None)
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.concat_param
        self.axis = int(p.concat_dim) if p.HasField("concat_dim") and not p.HasField("axis") else int(p.axis)

    def infer_shapes(self, bottom_shapes):
        s0 = bottom_shapes[0]
        ax = canonical_axis(self.axis, len(s0), self)
        for s in bottom_shapes[1:]:
            if len(s) != len(s0) or any(a != b for i, (a, b) in enumerate(zip(s, s0)) if i != ax):
                self.fail(f"Concat inputs differ outside axis {ax}: {[list(t) for t in bottom_shapes]}")
        return [s0[:ax] + (sum(s[ax] for s in bottom_shapes),) + s0[ax + 1:]]

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=canonical_axis(self.axis, xs[0].dim(), self))


@register("Slice")
class SliceLayer(CaffeLayer):
    """Split along ``axis`` at ``slice_point``s, or into equal parts when none are given."""

    tops = (1, None)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.slice_param
        self.axis = int(p.slice_dim) if p.HasField("slice_dim") and not p.HasField("axis") else int(p.axis)
        self.points = [int(v) for v in p.slice_point]
        if self.points and len(self.points) != self.num_tops - 1:
            self.fail(f"{len(self.points)} slice_point(s) for {self.num_tops} tops")
        if any(b <= a for a, b in zip(self.points, self.points[1:])):
            self.fail("slice_point values must increase")

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        ax, sizes = self._sizes(s)
        return [s[:ax] + (k,) + s[ax + 1:] for k in sizes]

    def forward(self, x: torch.Tensor) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
        ax, sizes = self._sizes(tuple(x.shape))
        parts = torch.split(x, sizes, dim=ax)
        return parts[0] if self.num_tops == 1 else tuple(parts)

    def _sizes(self, shape: tuple[int, ...]) -> tuple[int, list[int]]:
        """The axis and the size of each top along it, checked against the input shape."""
        ax = canonical_axis(self.axis, len(shape), self)
        n = shape[ax]
        if self.points:
            if self.points[-1] >= n or self.points[0] <= 0:
                self.fail(f"slice points {self.points} do not fit axis size {n}")
            bounds = [0] + self.points + [n]
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        else:
            if n % self.num_tops:
                self.fail(f"axis size {n} is not divisible by the {self.num_tops} tops")
            sizes = [n // self.num_tops] * self.num_tops
        return ax, sizes


@register("Split")
class SplitLayer(CaffeLayer):
    """Hand the same blob to several tops."""

    per_sample = True
    tops = (1, None)

    def infer_shapes(self, bottom_shapes):
        return [bottom_shapes[0]] * self.num_tops

    def forward(self, x: torch.Tensor) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
        return x if self.num_tops == 1 else (x,) * self.num_tops


@register("Flatten")
class FlattenLayer(CaffeLayer):
    """Merge axes ``axis`` .. ``end_axis`` into one."""

    per_sample = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.flatten_param
        self.axis, self.end_axis = int(p.axis), int(p.end_axis)

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        a = canonical_axis(self.axis, len(s), self)
        e = canonical_axis(self.end_axis, len(s), self, "end_axis")
        if e < a:
            self.fail(f"end_axis {self.end_axis} is before axis {self.axis}")
        return [s[:a] + (int(np.prod(s[a:e + 1], dtype=np.int64)),) + s[e + 1:]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = canonical_axis(self.axis, x.dim(), self)
        e = canonical_axis(self.end_axis, x.dim(), self, "end_axis")
        return torch.flatten(x, a, e)


@register("Reshape")
class ReshapeLayer(CaffeLayer):
    """Caffe Reshape: replace axes [axis, axis + num_axes) by ``shape``; 0 copies the input's
    dimension at that position, -1 (at most one) is inferred."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.reshape_param
        self.dims = [int(d) for d in p.shape.dim]
        self.axis, self.num_axes = int(p.axis), int(p.num_axes)
        if sum(d == -1 for d in self.dims) > 1:
            self.fail("at most one -1 in reshape shape")
        if any(d < -1 for d in self.dims):
            self.fail("reshape dims must be >= -1")
        if self.num_axes < -1:
            self.fail("num_axes must be >= -1")

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        return [tuple(self._out_shape(list(s), int(np.prod(s, dtype=np.int64))))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self._out_shape(list(x.shape), x.numel()))

    def _out_shape(self, shape: list[int], numel: int) -> list[int]:
        """The output shape for an input of ``shape`` (``numel`` elements), checked."""
        nd = len(shape)
        start = self.axis if self.axis >= 0 else nd + self.axis + 1
        if not 0 <= start <= nd:
            self.fail(f"axis {self.axis} out of range for a {nd}-D input")
        end = nd if self.num_axes == -1 else start + self.num_axes
        if end > nd:
            self.fail(f"axis {self.axis} + num_axes {self.num_axes} exceed the {nd}-D input")
        new = []
        for i, d in enumerate(self.dims):
            if d == 0:
                if start + i >= nd:
                    self.fail(f"dim 0 at position {i} copies a non-existent input axis")
                new.append(shape[start + i])
            else:
                new.append(d)
        out = shape[:start] + new + shape[end:]
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            total = numel
            if known == 0 or total % known:
                self.fail(f"cannot reshape {shape} to {out}")
            out[out.index(-1)] = total // known
        if int(np.prod(out, dtype=np.int64)) != numel:
            self.fail(f"cannot reshape {shape} ({numel} elements) to {out}")
        return out


@register("Permute")
class PermuteLayer(CaffeLayer):
    """SSD Permute: axes in ``order``, the ones not named follow in their original order."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.order = [int(o) for o in self.layer_param.permute_param.order]
        if len(set(self.order)) != len(self.order):
            self.fail(f"permute order {self.order} repeats an axis")

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if any(o >= len(s) for o in self.order):
            self.fail(f"permute order {self.order} out of range for a {len(s)}-D input")
        return [tuple(s[o] for o in self.order + [i for i in range(len(s)) if i not in self.order])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(o >= x.dim() for o in self.order):
            self.fail(f"permute order {self.order} out of range for a {x.dim()}-D input")
        order = self.order + [i for i in range(x.dim()) if i not in self.order]
        return x.permute(order).contiguous()


@register("Crop")
class CropLayer(CaffeLayer):
    """Crop bottom[0] to bottom[1]'s shape on axes >= ``axis``, starting at ``offset``."""

    bottoms = (2, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.crop_param
        self.axis = int(p.axis)
        self.offsets = [int(o) for o in p.offset]

    def forward(self, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        if x.dim() != ref.dim():
            self.fail(f"Crop inputs differ in rank: {x.dim()} vs {ref.dim()}")
        ax = canonical_axis(self.axis, x.dim(), self)
        n = x.dim() - ax
        if len(self.offsets) > 1 and len(self.offsets) != n:
            self.fail(f"{len(self.offsets)} crop offsets for {n} cropped axes")
        offs = self.offsets * n if len(self.offsets) == 1 else (self.offsets or [0] * n)
        index = [slice(None)] * ax
        for i, o in enumerate(offs):
            size = ref.shape[ax + i]
            if o + size > x.shape[ax + i]:
                self.fail(f"crop offset {o} + size {size} exceeds input size {x.shape[ax + i]} on axis {ax + i}")
            index.append(slice(o, o + size))
        return x[tuple(index)]


@register("Softmax")
class SoftmaxLayer(CaffeLayer):
    """Softmax over ``axis`` (default 1, the channels)."""

    per_sample = True
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.axis = int(self.layer_param.softmax_param.axis)

    def infer_shapes(self, bottom_shapes):
        canonical_axis(self.axis, len(bottom_shapes[0]), self)
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, dim=canonical_axis(self.axis, x.dim(), self))


@register("ArgMax")
class ArgMaxLayer(CaffeLayer):
    """Caffe ArgMax: with ``axis`` the top_k indices (or values with out_max_val) along it;
    without, per sample over everything else, shaped (N, 1 or 2, top_k, 1...) with the indices
    then (out_max_val) the values. Indices are returned as floats, as Caffe does."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.argmax_param
        self.out_max_val, self.top_k = bool(p.out_max_val), int(p.top_k)
        self.axis: Optional[int] = int(p.axis) if p.HasField("axis") else None
        if self.top_k < 1:
            self.fail("top_k must be >= 1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.axis is not None:
            ax = canonical_axis(self.axis, x.dim(), self)
            if self.top_k > x.shape[ax]:
                self.fail(f"top_k {self.top_k} exceeds axis size {x.shape[ax]}")
            vals, idx = torch.topk(x, self.top_k, dim=ax, largest=True, sorted=True)
            return vals if self.out_max_val else idx.to(x.dtype)
        if x.dim() < 3:
            self.fail("ArgMax without axis needs an input of at least 3 axes")
        flat = x.reshape(x.shape[0], -1)
        if self.top_k > flat.shape[1]:
            self.fail(f"top_k {self.top_k} exceeds the {flat.shape[1]} values per sample")
        vals, idx = torch.topk(flat, self.top_k, dim=1, largest=True, sorted=True)
        rest = (1,) * (x.dim() - 3)
        y = torch.stack([idx.to(x.dtype), vals], dim=1) if self.out_max_val else idx.to(x.dtype).unsqueeze(1)
        return y.reshape(y.shape + rest)


@register("Dropout")
class DropoutLayer(CaffeLayer):
    """Identity at test time (Caffe scales during training instead); caffe-fast-rcnn's
    ``scale_train: false`` (py-faster-rcnn, R-FCN) multiplies by ``scale`` = 1 - dropout_ratio
    instead, as that fork and OpenCV do."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.dropout_param
        self.scale = 1.0 if p.scale_train else float(1.0 - p.dropout_ratio)
        if not self.scale > 0:
            self.fail(f"Dropout with scale_train false needs dropout_ratio < 1, got {p.dropout_ratio}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.scale == 1.0 else x * self.scale


@register("Silence")
class SilenceLayer(CaffeLayer):
    """Consumes its bottoms, produces nothing; a blob only it reads stays a net output (as in
    Caffe and OpenCV, where users read it by name: colorization ends with one)."""

    bottoms = (1, None)
    tops = (0, 0)
    keeps_outputs = True

    def forward(self, *xs: torch.Tensor) -> None:
        return None
