"""ONNX mappings of the quantizable core and the common layers: the convolutions and
InnerProduct (with their quantized weights), Pooling, ReLU, Sigmoid, TanH, AbsVal, Dropout,
Softmax, Eltwise, Concat and the affine forms of BatchNorm and Scale.

Each is registered for its layer class (``layers.mapping``); where a type's other forms live
in another file (a Pooling with a mask top, a scaled Dropout, a batch-statistics BatchNorm, a
general Scale) the one mapping here hands them over, so that every class has one writer.
"""
from __future__ import annotations

import torch

from amct_torch.caffe.layers.traits import is_fully_connected
from amct_torch.export.onnx.layers import batchnorm_batch_stats, mapping, scale_bias
from amct_torch.export.onnx.layers_mobile import pool_with_mask
from amct_torch.export.onnx.layers_rcnn import dropout_scaled


@mapping("Convolution", "Deconvolution", "InnerProduct")  # the depthwise forks inherit Convolution's
def _weighted(b, mod, xs, ins, outs):
    lq = b.plan.get(mod.caffe_name)
    y = b.fc(mod, xs[0], ins[0], lq) if is_fully_connected(mod) else b.conv(mod, xs[0], lq)
    if mod.caffe_name in b.out_factors:
        y = b.qdq(y, mod.caffe_name, "out", *b.out_factors[mod.caffe_name])
    return [y]


@mapping("Pooling")
def _pooling(b, mod, xs, ins, outs):
    if mod.num_tops == 1:
        return [b.pool(mod, xs[0], ins[0])]
    return pool_with_mask(b, mod, xs, ins, outs)


@mapping("ReLU")
def _relu(b, mod, xs, ins, outs):
    if mod.negative_slope != 0.0:
        return b.node("LeakyRelu", xs, mod.caffe_name, alpha=mod.negative_slope)
    return b.node("Relu", xs, mod.caffe_name)


@mapping("Sigmoid", "TanH", "AbsVal")
def _unary(b, mod, xs, ins, outs):
    return b.node({"Sigmoid": "Sigmoid", "TanH": "Tanh", "AbsVal": "Abs"}[mod.caffe_type], xs, mod.caffe_name)


@mapping("Dropout")
def _dropout(b, mod, xs, ins, outs):
    if getattr(mod, "scale", 1.0) == 1.0:
        return b.node("Identity", xs, mod.caffe_name)
    return dropout_scaled(b, mod, xs, ins, outs)


@mapping("Softmax")
def _softmax(b, mod, xs, ins, outs):
    return b.node("Softmax", xs, mod.caffe_name, axis=int(mod.layer_param.softmax_param.axis))


@mapping("Eltwise")
def _eltwise(b, mod, xs, ins, outs):
    if mod.caffe_name in b.eltwise:
        return [b.quant_eltwise(mod, xs, b.eltwise[mod.caffe_name])]
    return [b.eltwise_node(mod, xs)]


@mapping("Concat")
def _concat(b, mod, xs, ins, outs):
    return b.node("Concat", xs, mod.caffe_name, axis=int(mod.axis))


@mapping("BatchNorm")
def _batchnorm(b, mod, xs, ins, outs):
    if mod.uses_batch_stats:
        return batchnorm_batch_stats(b, mod, xs, ins, outs)
    std = torch.sqrt(mod.var + mod.eps)
    return [b.affine(mod, xs[0], ins[0], 1.0 / std, -mod.mean / std)]


@mapping("Scale")
def _scale(b, mod, xs, ins, outs):
    if len(xs) == 1 and mod.axis % len(ins[0]) == 1 and mod.num_axes == 1 \
            and mod.weight is not None and mod.weight.dim() == 1:
        return [b.affine(mod, xs[0], ins[0], mod.weight, mod.bias)]
    return scale_bias(b, mod, xs, ins, outs)
