"""Element-wise layers: ReLU, PReLU, Sigmoid, TanH, ELU, AbsVal, BNLL, Power, Exp, Log,
Threshold, Clip, Swish — each with Caffe's parameter defaults."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from amct_torch.caffe.layers.base import CaffeLayer, register, to_numpy


@register("ReLU")
class ReLULayer(CaffeLayer):
    """y = max(x, 0) + negative_slope * min(x, 0)."""

    per_sample = True
    same_shape = True
    can_run_inplace = True
    fresh_output = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.negative_slope = float(self.layer_param.relu_param.negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.negative_slope == 0.0:
            return F.relu(x, inplace=self.may_overwrite(x))
        return F.leaky_relu(x, self.negative_slope, inplace=self.may_overwrite(x))


@register("PReLU")
class PReLULayer(CaffeLayer):
    """y = max(x, 0) + a_c * min(x, 0), a per channel (axis 1) or one shared value."""

    per_sample = True
    fillers = ("prelu_param", (("filler", 0.25),))
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        self.channel_shared = bool(self.layer_param.prelu_param.channel_shared)
        self.expect_blob_count(blobs, 1, 1)
        n = 1 if self.channel_shared else (bottom_shapes[0][1] if bottom_shapes and len(bottom_shapes[0]) > 1 else None)
        if blobs is None:
            if n is None:
                self.fail("no weights and no input shape to size them")
            w = torch.full((n,), 0.25)
        else:
            w = torch.from_numpy(np.asarray(blobs[0], np.float32).reshape(-1).copy())
            if n is not None and w.numel() != n:
                self.fail(f"slope blob has {w.numel()} elements, expected {n}")
        self.weight = nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.weight if self.channel_shared else self.weight.view((1, -1) + (1,) * (x.dim() - 2))
        return torch.where(x > 0, x, x * a)

    def caffe_blobs(self) -> list[np.ndarray]:
        return [to_numpy(self.weight)]


@register("Sigmoid")
class SigmoidLayer(CaffeLayer):
    per_sample = True
    same_shape = True
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


@register("TanH")
class TanHLayer(CaffeLayer):
    per_sample = True
    same_shape = True
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


@register("ELU")
class ELULayer(CaffeLayer):
    """y = x if x > 0 else alpha * (exp(x) - 1)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.alpha = float(self.layer_param.elu_param.alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, self.alpha)


@register("AbsVal")
class AbsValLayer(CaffeLayer):
    per_sample = True
    same_shape = True
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(x)


@register("BNLL")
class BNLLLayer(CaffeLayer):
    """y = log(1 + exp(x)), computed without overflow."""

    per_sample = True
    same_shape = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x + torch.log1p(torch.exp(-x.abs())), torch.log1p(torch.exp(-x.abs())))


@register("Power")
class PowerLayer(CaffeLayer):
    """y = (shift + scale * x) ^ power."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.shift if (self.scale != 1.0 or self.shift != 0.0) else x
        return y if self.power == 1.0 else torch.pow(y, self.power)


@register("Exp")
class ExpLayer(CaffeLayer):
    """y = base ^ (shift + scale * x); base -1 means e."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.exp_param
        if p.base != -1 and p.base <= 0:
            self.fail("base must be strictly positive (or -1 for e)")
        ln = 1.0 if p.base == -1 else math.log(p.base)
        self.in_scale, self.in_shift = ln * float(p.scale), ln * float(p.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x * self.in_scale + self.in_shift)


@register("Log")
class LogLayer(CaffeLayer):
    """y = log_base(shift + scale * x); base -1 means e."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.log_param
        if p.base != -1 and p.base <= 0:
            self.fail("base must be strictly positive (or -1 for e)")
        self.inv_ln = 1.0 if p.base == -1 else 1.0 / math.log(p.base)
        self.scale, self.shift = float(p.scale), float(p.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x * self.scale + self.shift) * self.inv_ln


@register("Threshold")
class ThresholdLayer(CaffeLayer):
    """y = 1 if x > threshold else 0."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.threshold = float(self.layer_param.threshold_param.threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > self.threshold).to(x.dtype)


@register("Clip")
class ClipLayer(CaffeLayer):
    """y = min(max(x, min), max)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.clip_param
        self.min, self.max = float(p.min), float(p.max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.min, self.max)


@register("Swish")
class SwishLayer(CaffeLayer):
    """y = x * sigmoid(beta * x)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.beta = float(self.layer_param.swish_param.beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)
