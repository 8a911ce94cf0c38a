"""ONNX mappings of the segmentation forks' layers: ``Interp`` (Slice + Resize with aligned
corners), ``MVN`` (ReduceMean/Sqrt), and YOLOv2's ``Reorg`` (Reshape/Transpose) and ``Region``
(decoding + per-class NonMaxSuppression), opset 17.

Why separate from ``layers``: these types come from forks (PSPNet, DeepLab, YOLOv2) and each
carries its fork's size rule; the torch modules in ``amct_torch.caffe.layers.interp`` and
``.yolo`` are the reference the mappings are tested against (and OpenCV where it implements
them). Interp's output size is computed from the runtime shape, so its spatial size stays
symbolic; Reorg writes its sizes as constants (``b.static``).
"""
from __future__ import annotations

import numpy as np

from amct_torch.export.onnx.layers import _const, mapping

_I64_MAX = np.iinfo(np.int64).max


def _dim_pair(b, mod, shape: str, tag: str) -> str:
    """The (H, W) dims of a Shape output, as int64 (2,)."""
    idx = _const(b, f"{mod.caffe_name}_{tag}_hw_idx", [2, 3], np.int64)
    return b.node("Gather", [shape, idx], f"{mod.caffe_name}_{tag}_hw")[0]


@mapping("Interp")
def _interp(b, mod, xs, ins, outs):
    name = mod.caffe_name
    x = xs[0]
    if mod.pad_beg or mod.pad_end:
        starts = _const(b, f"{name}_crop_starts", [-mod.pad_beg] * 2, np.int64)
        ends = _const(b, f"{name}_crop_ends", [mod.pad_end if mod.pad_end else _I64_MAX] * 2, np.int64)
        axes = _const(b, f"{name}_crop_axes", [2, 3], np.int64)
        x = b.node("Slice", [x, starts, ends, axes], f"{name}_crop")[0]
    shape = b.node("Shape", [x], f"{name}_in_shape")[0]
    nc = b.node("Slice", [shape, _const(b, f"{name}_nc_s", [0], np.int64), _const(b, f"{name}_nc_e", [2], np.int64)],
                f"{name}_nc")[0]
    if len(xs) > 1:
        hw = _dim_pair(b, mod, b.node("Shape", [xs[1]], f"{name}_ref_shape")[0], "ref")
    elif mod.size is not None and not (mod.zoom is not None or mod.shrink is not None):
        hw = _const(b, f"{name}_size", list(mod.size), np.int64)
    else:
        hw = _dim_pair(b, mod, shape, "in")
        one = _const(b, f"{name}_one", 1, np.int64)
        if mod.shrink is not None:   # (h - 1) / s + 1 (h >= 1: integer division = C's)
            t = b.node("Sub", [hw, one], f"{name}_hm1")[0]
            t = b.node("Div", [t, _const(b, f"{name}_shrink", mod.shrink, np.int64)], f"{name}_shrunk")[0]
            hw = b.node("Add", [t, one], f"{name}_hw_s")[0]
        if mod.zoom is not None:     # h + (h - 1)(z - 1) = (h - 1) z + 1
            t = b.node("Sub", [hw, one], f"{name}_hm1z")[0]
            t = b.node("Mul", [t, _const(b, f"{name}_zoom", mod.zoom, np.int64)], f"{name}_zoomed")[0]
            hw = b.node("Add", [t, one], f"{name}_hw_z")[0]
    sizes = b.node("Concat", [nc, hw], f"{name}_sizes", axis=0)[0]
    return b.node("Resize", [x, "", "", sizes], name, mode="linear",
                  coordinate_transformation_mode="align_corners")


@mapping("MVN")
def _mvn(b, mod, xs, ins, outs):
    name = mod.caffe_name
    axes = mod.axes(len(ins[0]))
    if not axes:
        return b.node("Sub", [xs[0], xs[0]], name)
    mean = b.node("ReduceMean", xs, f"{name}_mean", axes=axes, keepdims=1)[0]
    d = b.node("Sub", [xs[0], mean], f"{name}_centred" if mod.normalize_variance else name)[0]
    if not mod.normalize_variance:
        return [d]
    var = b.node("ReduceMean", [b.node("Mul", [d, d], f"{name}_sq")[0]], f"{name}_var", axes=axes, keepdims=1)[0]
    std = b.node("Sqrt", [var], f"{name}_std")[0]
    std = b.node("Add", [std, _const(b, f"{name}_eps", mod.eps)], f"{name}_std_eps")[0]
    return b.node("Div", [d, std], name)


@mapping("Reorg")
def _reorg(b, mod, xs, ins, outs):
    name = mod.caffe_name
    _, c, h, w = (int(d) for d in ins[0])
    s = mod.stride
    b.static(mod)
    t = b.node("Reshape", [xs[0], _const(b, f"{name}_shape6", [0, c // (s * s), h, s, w, s], np.int64)],
               f"{name}_split")[0]
    t = b.node("Transpose", [t], f"{name}_perm", perm=[0, 3, 5, 1, 2, 4])[0]
    return b.node("Reshape", [t, _const(b, f"{name}_shape4", [0, c * s * s, h // s, w // s], np.int64)], name)


@mapping("Region")
def _region(b, mod, xs, ins, outs):
    """YOLOv2's region layer: sigmoid/exp decoding against constant grid offsets and anchors,
    Softmax (or Sigmoid) class scores times the objectness, the ``thresh`` cut, and per class a
    NonMaxSuppression (centre-size boxes) whose selections keep their scores (the rest become
    0). Rows [x, y, w, h, objectness, scores] for every cell and anchor (fixed spatial size)."""
    name = mod.caffe_name
    _, h, w, _ = (int(d) for d in ins[0])
    a, c, cell = mod.anchors, mod.classes, mod.cell
    hwa = h * w * a
    b.static(mod)

    def op(kind, inputs, tag, **kw):
        return b.node(kind, inputs, f"{name}_{tag}", **kw)[0]

    def const(tag, v, dt=np.float32):
        return _const(b, f"{name}_{tag}", v, dt)

    v = op("Reshape", [xs[0], const("cells", [0, h, w, a, cell], np.int64)], "cells")
    xy, wh, obj, cls = b.node("Split", [v, const("split", [2, 2, 1, c], np.int64)], f"{name}_part", n_out=4, axis=4)
    grid = np.zeros((h, w, 1, 2), np.float32)
    grid[..., 0] = np.arange(w, dtype=np.float32).reshape(1, w, 1)
    grid[..., 1] = np.arange(h, dtype=np.float32).reshape(h, 1, 1)
    size = np.array([w, h], np.float32)
    bias = mod.bias.detach().cpu().float().numpy().reshape(a, 2)
    bxy = op("Div", [op("Add", [op("Sigmoid", [xy], "sig_xy"), const("grid", grid)], "xy_cell"), const("size", size)],
             "xy")
    bwh = op("Mul", [op("Exp", [wh], "exp_wh"), const("anchors", bias)], "wh_px")
    bwh = op("Div", [bwh, const("size2", size)], "wh")
    obj = op("Sigmoid", [obj], "obj")
    cls = op("Softmax", [cls], "cls", axis=4) if mod.softmax else op("Sigmoid", [cls], "cls")
    prob = op("Mul", [obj, cls], "prob")
    zero = const("zero", 0.0)
    prob = op("Where", [op("Greater", [prob, const("thresh", mod.thresh)], "above"), prob, zero], "prob_thr")
    boxes = op("Reshape", [op("Concat", [bxy, bwh], "box", axis=4), const("box_shape", [0, hwa, 4], np.int64)], "boxes")
    prob = op("Reshape", [prob, const("prob_shape", [0, hwa, c], np.int64)], "probs")       # (N, HWA, C)
    if mod.nms_threshold > 0:
        scores = op("Transpose", [prob], "scores", perm=[0, 2, 1])                           # (N, C, HWA)
        sel = op("NonMaxSuppression", [boxes, scores, const("max_out", [hwa], np.int64),
                                       const("iou", [mod.nms_threshold]), const("score_thr", [mod.thresh])],
                 "nms", center_point_box=1)
        ones = op("Cast", [op("Gather", [sel, const("col0", 0, np.int64)], "sel0", axis=1)], "ones_f", to=1)
        ones = op("Add", [op("Mul", [ones, zero], "zeros_k"), const("one", 1.0)], "ones")  # (K,) of 1
        mask = op("ScatterND", [op("Mul", [scores, zero], "mask0"), sel, ones], "mask")
        prob = op("Transpose", [op("Mul", [scores, mask], "kept")], "probs_nms", perm=[0, 2, 1])
    obj = op("Reshape", [obj, const("obj_shape", [0, hwa, 1], np.int64)], "obj_rows")
    rows = op("Concat", [boxes, obj, prob], "rows", axis=2)
    return b.node("Reshape", [rows, const("out_shape", [-1, cell], np.int64)], name)
