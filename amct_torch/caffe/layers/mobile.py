"""The mobile-net forks' layer types: the two depthwise convolutions, ShuffleChannel, ReLU6,
HardSwish, HardSigmoid and Axpy (squeeze-excitation), each with its fork's test-time semantics.

Why the depthwise types are ``ConvolutionLayer`` subclasses: both forks compute exactly a
grouped Convolution, so they are quantized, fused and exported as one (they inherit its
traits and ONNX mapping); only ``caffe_type`` keeps the user's own type name, which the
Caffe writers put back so that the user's fork still runs the written models.
"""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe.layers.base import CaffeLayer, register
from amct_torch.caffe.layers.conv import ConvolutionLayer, _hw


@register("DepthwiseConvolution")
class DepthwiseConvolutionLayer(ConvolutionLayer):
    """MobileNet-YOLO's (yonghenglh6) DepthwiseConvolution: Caffe's BaseConvolutionLayer with
    ``convolution_param`` as given (``group`` is the user's); its CPU forward is Convolution's."""

    depthwise = True
    fold_scale_before = False


@register("ConvolutionDepthwise")
class ConvolutionDepthwiseLayer(ConvolutionLayer):
    """The ConvolutionDepthwise fork (ShuffleNet, darknet2caffe's MobileNets): one kh x kw filter
    per input channel, so the output has as many channels as the input. The fork reads no
    ``group`` and ignores ``num_output`` (here it must be C when given: the quantization config
    sizes the per-channel factors from it); weight (C, 1, kh, kw), bias (C) when ``bias_term``.

    The module runs as a Convolution with num_output = group = C; ``layer_param`` keeps the
    user's text unchanged for the writers."""

    depthwise = True
    fold_scale_before = False

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.convolution_param
        kh, kw = _hw(self, p, "kernel_size", "kernel_h", "kernel_w", None)
        channels = None
        if bottom_shapes is not None and len(bottom_shapes[0]) == 4:
            channels = int(bottom_shapes[0][1])
        elif blobs:
            if kh < 1 or kw < 1 or blobs[0].size % (kh * kw):
                self.fail(f"weight blob has {blobs[0].size} elements, not a multiple of the "
                          f"kernel {kh}x{kw}")
            channels = blobs[0].size // (kh * kw)
        if channels is None:
            self.fail("no weights and no input shape to size the depthwise filters")
        if channels < 1:
            self.fail("ConvolutionDepthwise needs at least one input channel")
        if p.HasField("num_output") and p.num_output != channels:
            # the fork ignores it, but the quantization config and record size the per-channel
            # weight factors from num_output, as for every convolution
            self.fail(f"num_output {p.num_output} differs from the {channels} input channels; "
                      "ConvolutionDepthwise makes one output channel per input channel: set "
                      f"num_output: {channels}")
        user = self.layer_param
        as_conv = type(user)()
        as_conv.CopyFrom(user)
        as_conv.convolution_param.num_output = channels
        as_conv.convolution_param.group = channels
        self.layer_param = as_conv
        try:
            super().setup(blobs, bottom_shapes)
        finally:
            self.layer_param = user


@register("ShuffleChannel")
class ShuffleChannelLayer(CaffeLayer):
    """ShuffleNet's channel shuffle: the channels seen as a (group, C/group) matrix are
    transposed, i.e. output channel j*group + i is input channel i*(C/group) + j."""

    per_sample = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        self.group = int(self.layer_param.shuffle_channel_param.group)
        if self.group < 1:
            self.fail("shuffle_channel_param.group must be > 0")

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) < 2:
            self.fail(f"ShuffleChannel needs an input with a channel axis, got {list(s)}")
        if s[1] % self.group:
            self.fail(f"input has {s[1]} channels, not divisible by group {self.group}")
        return [tuple(s)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[0], x.shape[1]
        y = x.reshape(n, self.group, c // self.group, -1).transpose(1, 2)
        return y.reshape(x.shape)


@register("ReLU6")
class ReLU6Layer(CaffeLayer):
    """y = min(max(x, 0) + negative_slope * min(x, 0), threshold); ``relu6_param`` is optional
    (threshold 6 and slope 0 by default, as in the forks)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.relu6_param
        self.negative_slope = float(p.negative_slope)
        self.threshold = float(p.threshold)
        if not np.isfinite(self.negative_slope) or not np.isfinite(self.threshold):
            self.fail("relu6_param values must be finite")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clamp(x, min=0.0) if self.negative_slope == 0.0 else torch.where(x > 0, x, x * self.negative_slope)
        return torch.clamp(y, max=self.threshold)


@register("HardSwish")
class HardSwishLayer(CaffeLayer):
    """y = x * min(max(x / 6 + 1/2, 0), 1), as the forks compute it (no parameters)."""

    per_sample = True
    same_shape = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)


@register("HardSigmoid")
class HardSigmoidLayer(CaffeLayer):
    """y = min(max(alpha * x + beta, 0), 1) with ``hardsigmoid_param`` (alpha 0.2, beta 0.5 by
    default, MobileNet-YOLO's fixed values)."""

    per_sample = True
    same_shape = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.hardsigmoid_param
        self.alpha, self.beta = float(p.alpha), float(p.beta)
        if not (np.isfinite(self.alpha) and np.isfinite(self.beta)):
            self.fail("hardsigmoid_param alpha and beta must be finite")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * self.alpha + self.beta, 0.0, 1.0)


@register("Axpy")
class AxpyLayer(CaffeLayer):
    """SENet's Axpy: bottoms a (N, C) or (N, C, 1, 1), x and y (same shape); top = a * x + y,
    a broadcast over x's spatial axes."""

    per_sample = True
    bottoms = (3, 3)

    def infer_shapes(self, bottom_shapes):
        a, x, y = (tuple(s) for s in bottom_shapes)
        if len(a) < 2 or len(x) < 2 or a[:2] != x[:2]:
            self.fail(f"Axpy's first bottom {list(a)} must have the (num, channels) of the second {list(x)}")
        if any(d != 1 for d in a[2:]):
            self.fail(f"Axpy's first bottom {list(a)} must be 1 x 1 beyond (num, channels)")
        if x != y:
            self.fail(f"Axpy's second and third bottoms differ in shape: {list(x)} vs {list(y)}")
        return [x]

    def forward(self, a: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scale = a.reshape(a.shape[0], a.shape[1], *([1] * (x.dim() - 2)))
        return torch.addcmul(y, scale, x)
