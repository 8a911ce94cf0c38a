"""ONNX mappings (opset 17, standard ops) of the mobile / YOLO / SegNet forks' layers:
ShuffleChannel, ReLU6, HardSwish, HardSigmoid, Axpy, Upsample (nearest Resize, or SegNet's
unpooling as ScatterElements), BN, and a MAX Pooling with its argmax-mask top.

Why separate from ``layers``: these types come from forks; the torch modules in
``amct_torch.caffe.layers.mobile``, ``.upsample`` and ``.segnet`` hold each fork's semantics and
are the reference the mappings are tested against. The depthwise convolutions need no mapping
here: the exporter writes them as the grouped ``Conv`` they are (per-channel int8 weights).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from amct_torch.caffe.layers.pooling import caffe_pooled_size
from amct_torch.export.onnx.layers import _channel_view, _const, _np, mapping

_MAX = 0


@mapping("ShuffleChannel")
def _shuffle_channel(b, mod, xs, ins, outs):
    name, c = mod.caffe_name, int(ins[0][1])
    shape = b.node("Shape", [xs[0]], f"{name}_shape")[0]
    grid = _const(b, f"{name}_grid", [0, mod.group, c // mod.group, -1], np.int64)
    t = b.node("Reshape", [xs[0], grid], f"{name}_groups")[0]
    t = b.node("Transpose", [t], f"{name}_swap", perm=[0, 2, 1, 3])[0]
    return b.node("Reshape", [t, shape], name)


@mapping("ReLU6")
def _relu6(b, mod, xs, ins, outs):
    name = mod.caffe_name
    hi = _const(b, f"{name}_max", mod.threshold)
    if mod.negative_slope == 0.0 and mod.threshold >= 0.0:
        return b.node("Clip", [xs[0], _const(b, f"{name}_min", 0.0), hi], name)
    y = b.node("LeakyRelu", xs, f"{name}_leaky", alpha=mod.negative_slope)[0] if mod.negative_slope != 0.0 \
        else b.node("Relu", xs, f"{name}_relu")[0]
    return b.node("Min", [y, hi], name)


@mapping("HardSigmoid")
def _hard_sigmoid(b, mod, xs, ins, outs):
    return b.node("HardSigmoid", xs, mod.caffe_name, alpha=mod.alpha, beta=mod.beta)


@mapping("HardSwish")
def _hard_swish(b, mod, xs, ins, outs):
    return b.node("HardSwish", xs, mod.caffe_name)


@mapping("Axpy")
def _axpy(b, mod, xs, ins, outs):
    name = mod.caffe_name
    a = xs[0]
    if len(ins[0]) < len(ins[1]):
        view = _const(b, f"{name}_a_shape", [0, 0] + [1] * (len(ins[1]) - 2), np.int64)
        a = b.node("Reshape", [a, view], f"{name}_a")[0]
    ax = b.node("Mul", [a, xs[1]], f"{name}_ax")[0]
    return b.node("Add", [ax, xs[2]], name)


@mapping("Upsample")
def _upsample(b, mod, xs, ins, outs):
    name = mod.caffe_name
    if not mod.unpool:
        if mod.scale == 1:
            return b.node("Identity", xs[:1], name)
        scales = _const(b, f"{name}_scales", [1.0, 1.0, float(mod.scale), float(mod.scale)])
        return b.node("Resize", [xs[0], "", scales], name, mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    # SegNet: scatter each plane's values to their mask positions; positions outside the
    # output go to one spare slot that is cut off (the torch module's rule)
    b.static(mod)
    oh, ow = int(outs[0][2]), int(outs[0][3])
    size = oh * ow
    flat = _const(b, f"{name}_flat", [0, 0, -1], np.int64)
    vals = b.node("Reshape", [xs[0], flat], f"{name}_vals")[0]
    idx = b.node("Reshape", [xs[1], flat], f"{name}_mask_flat")[0]
    idx = b.node("Cast", [idx], f"{name}_idx", to=TensorProto.INT64)[0]
    size_c = _const(b, f"{name}_size", size, np.int64)
    low = b.node("Less", [idx, _const(b, f"{name}_zero", 0, np.int64)], f"{name}_low")[0]
    high = b.node("GreaterOrEqual", [idx, size_c], f"{name}_high")[0]
    bad = b.node("Or", [low, high], f"{name}_bad")[0]
    idx = b.node("Where", [bad, size_c, idx], f"{name}_idx_safe")[0]
    shape = b.node("Shape", [xs[0]], f"{name}_nc", start=0, end=2)[0]
    shape = b.node("Concat", [shape, _const(b, f"{name}_slots", [size + 1], np.int64)], f"{name}_buf_shape",
                   axis=0)[0]
    zero = b.node("ConstantOfShape", [shape], f"{name}_zeros",
                  value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]))[0]
    out = b.node("ScatterElements", [zero, idx, vals], f"{name}_scatter", axis=2)[0]
    out = b.node("Slice", [out, _const(b, f"{name}_s0", [0], np.int64), _const(b, f"{name}_s1", [size], np.int64),
                           _const(b, f"{name}_s2", [2], np.int64)], f"{name}_cut")[0]
    return b.node("Reshape", [out, _const(b, f"{name}_out_shape", [0, 0, oh, ow], np.int64)], name)


@mapping("BN")
def _bn(b, mod, xs, ins, outs):
    name, rank = mod.caffe_name, len(ins[0])
    scale = _channel_view(b, mod, _np(mod.weight), rank, "scale")
    shift = _channel_view(b, mod, _np(mod.bias), rank, "shift")
    ab = mod.affine()
    if ab is not None:
        a = _channel_view(b, mod, _np(ab[0]), rank, "a")
        c = _channel_view(b, mod, _np(ab[1]), rank, "b")
        y = b.node("Mul", [xs[0], a], f"{name}_mul")[0]
        return b.node("Add", [y, c], name)
    axes = [0] + list(range(2, rank))
    mean = b.node("ReduceMean", xs, f"{name}_mean", axes=axes, keepdims=1)[0]
    sq = b.node("Mul", [xs[0], xs[0]], f"{name}_sq")[0]
    ex2 = b.node("ReduceMean", [sq], f"{name}_ex2", axes=axes, keepdims=1)[0]
    var = b.node("Sub", [ex2, b.node("Mul", [mean, mean], f"{name}_mean_sq")[0]], f"{name}_var")[0]
    std = b.node("Sqrt", [b.node("Add", [var, _const(b, f"{name}_eps", mod.eps)], f"{name}_var_eps")[0]],
                 f"{name}_std")[0]
    y = b.node("Div", [b.node("Sub", [xs[0], mean], f"{name}_centred")[0], std], f"{name}_norm")[0]
    return b.node("Add", [b.node("Mul", [y, scale], f"{name}_scaled")[0], shift], name)


def pool_with_mask(b, mod, xs, ins, outs):
    """MAX pooling with its second top: MaxPool's Indices (flat over the whole tensor) taken
    modulo H * W give Caffe's per-plane mask (``layers_core`` writes one-top Pooling)."""
    if mod.num_tops != 2 or mod.method != _MAX:
        b.fail(mod, "only a MAX Pooling with a mask top is written here")
    name = mod.caffe_name
    b.static(mod)
    h, w = int(ins[0][-2]), int(ins[0][-1])
    if mod.global_pooling:
        (kh, kw), (sh, sw), (ph, pw) = (h, w), (1, 1), (0, 0)
    else:
        (kh, kw), (sh, sw), (ph, pw) = mod.kernel_size, mod.stride, mod.padding
    oh, ow = caffe_pooled_size(h, kh, sh, ph, mod.ceil), caffe_pooled_size(w, kw, sw, pw, mod.ceil)
    eh, ew = max(0, (oh - 1) * sh + kh - h - ph), max(0, (ow - 1) * sw + kw - w - pw)
    y, ind = b.node("MaxPool", [xs[0]], name, n_out=2, kernel_shape=[kh, kw], strides=[sh, sw],
                    pads=[ph, pw, eh, ew])
    plane = b.node("Mod", [ind, _const(b, f"{name}_plane", h * w, np.int64)], f"{name}_plane_idx")[0]
    return [y, b.node("Cast", [plane], f"{name}_mask", to=TensorProto.FLOAT)[0]]
