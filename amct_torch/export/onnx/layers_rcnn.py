"""ONNX mappings of the two-stage detectors' layers, opset 17: ``ROIPooling`` (MaxRoiPool),
``PSROIPooling`` (bin masks built from the ROIs, contracted with Einsum) and ``Proposal`` /
py-faster-rcnn's Python proposal layer (anchor decoding, TopK, NonMaxSuppression).

Why these shapes: ONNX has no position-sensitive ROI pooling, but R-FCN's bins are intervals on
each axis, so a bin is a row mask times a column mask. The proposals' NMS gets boxes with x2 + 1
and y2 + 1 so that its areas are Caffe's (x2 − x1 + 1); boxes less than a pixel apart are the
one difference (docs/export.md). The anchors are constants: the layer fixes the spatial size."""
from __future__ import annotations

import numpy as np

from amct_torch.export.onnx.layers import _const, mapping


def _op(b, mod, kind: str, ins: list, tag: str, **kw) -> str:
    return b.node(kind, ins, f"{mod.caffe_name}_{tag}", **kw)[0]


def _c(b, mod, tag: str, v, dt=np.float32) -> str:
    return _const(b, f"{mod.caffe_name}_{tag}", v, dt)


def _c_round(b, mod, x: str, tag: str) -> str:
    """C's round (half away from zero): sign(x)·floor(|x| + 0.5)."""
    t = _op(b, mod, "Add", [_op(b, mod, "Abs", [x], f"{tag}_abs"), _c(b, mod, f"{tag}_half", 0.5)], f"{tag}_plus")
    t = _op(b, mod, "Floor", [t], f"{tag}_floor")
    return _op(b, mod, "Mul", [_op(b, mod, "Sign", [x], f"{tag}_sign"), t], f"{tag}_round")


def _roi_columns(b, mod, rois: str) -> list[str]:
    r = _op(b, mod, "Reshape", [rois, _c(b, mod, "rois_shape", [-1, 5], np.int64)], "rois")
    return b.node("Split", [r], f"{mod.caffe_name}_roi_col", n_out=5, axis=1)   # each (R, 1)


@mapping("ROIPooling")
def _roi_pooling(b, mod, xs, ins, outs):
    r = _op(b, mod, "Reshape", [xs[1], _c(b, mod, "rois_shape", [-1, 5], np.int64)], "rois")
    return b.node("MaxRoiPool", [xs[0], r], mod.caffe_name, pooled_shape=[mod.pooled_h, mod.pooled_w],
                  spatial_scale=mod.spatial_scale)


def _bin_mask(b, mod, start: str, end: str, size: str, tag: str) -> str:
    """(R, G, size) float mask of start <= i < end."""
    ar = _op(b, mod, "Cast", [_op(b, mod, "Range", [_c(b, mod, f"{tag}_zero", 0, np.int64), size,
                                                   _c(b, mod, f"{tag}_one", 1, np.int64)], f"{tag}_range")],
             f"{tag}_range_f", to=1)
    ax2 = _c(b, mod, f"{tag}_ax2", [2], np.int64)
    ge = _op(b, mod, "GreaterOrEqual", [ar, _op(b, mod, "Unsqueeze", [start, ax2], f"{tag}_s_u")], f"{tag}_ge")
    lt = _op(b, mod, "Less", [ar, _op(b, mod, "Unsqueeze", [end, ax2], f"{tag}_e_u")], f"{tag}_lt")
    return _op(b, mod, "Cast", [_op(b, mod, "And", [ge, lt], f"{tag}_in")], f"{tag}_mask", to=1)


@mapping("PSROIPooling")
def _psroi_pooling(b, mod, xs, ins, outs):
    name, g, d = mod.caffe_name, mod.group_size, mod.output_dim
    cols = _roi_columns(b, mod, xs[1])
    scale = _c(b, mod, "scale", mod.spatial_scale)
    one = _c(b, mod, "one_f", 1.0)
    x1 = _op(b, mod, "Mul", [_c_round(b, mod, cols[1], "x1"), scale], "x1s")
    y1 = _op(b, mod, "Mul", [_c_round(b, mod, cols[2], "y1"), scale], "y1s")
    x2 = _op(b, mod, "Mul", [_op(b, mod, "Add", [_c_round(b, mod, cols[3], "x2"), one], "x2p"), scale], "x2s")
    y2 = _op(b, mod, "Mul", [_op(b, mod, "Add", [_c_round(b, mod, cols[4], "y2"), one], "y2p"), scale], "y2s")
    tenth, gf = _c(b, mod, "min_size", 0.1), _c(b, mod, "groups", float(g))
    bh = _op(b, mod, "Div", [_op(b, mod, "Max", [_op(b, mod, "Sub", [y2, y1], "rh"), tenth], "rh_min"), gf], "bh")
    bw = _op(b, mod, "Div", [_op(b, mod, "Max", [_op(b, mod, "Sub", [x2, x1], "rw"), tenth], "rw_min"), gf], "bw")
    p0 = _c(b, mod, "p0", np.arange(g, dtype=np.float32).reshape(1, g))
    p1 = _c(b, mod, "p1", np.arange(1, g + 1, dtype=np.float32).reshape(1, g))
    shape = _op(b, mod, "Shape", [xs[0]], "x_shape")
    hw = _op(b, mod, "Gather", [shape, _c(b, mod, "hw_idx", [2, 3], np.int64)], "hw")
    h_i = _op(b, mod, "Gather", [shape, _c(b, mod, "h_idx", 2, np.int64)], "h")
    w_i = _op(b, mod, "Gather", [shape, _c(b, mod, "w_idx", 3, np.int64)], "w")
    zero = _c(b, mod, "zero_f", 0.0)

    def edges(bin_size: str, start: str, size: str, tag: str) -> tuple[str, str]:
        lo = _op(b, mod, "Floor", [_op(b, mod, "Add", [_op(b, mod, "Mul", [p0, bin_size], f"{tag}_a"), start],
                                       f"{tag}_b")], f"{tag}_start")
        hi = _op(b, mod, "Ceil", [_op(b, mod, "Add", [_op(b, mod, "Mul", [p1, bin_size], f"{tag}_c"), start],
                                      f"{tag}_d")], f"{tag}_end")
        sf = _op(b, mod, "Cast", [size], f"{tag}_size_f", to=1)
        clip = [_op(b, mod, "Min", [_op(b, mod, "Max", [v, zero], f"{tag}_{k}_lo"), sf], f"{tag}_{k}_clip")
                for k, v in (("s", lo), ("e", hi))]
        return clip[0], clip[1]

    hs, he = edges(bh, y1, h_i, "h")
    ws, we = edges(bw, x1, w_i, "w")
    mh = _bin_mask(b, mod, hs, he, h_i, "mh")                               # (R, G, H)
    mw = _bin_mask(b, mod, ws, we, w_i, "mw")                               # (R, G, W)
    x6_shape = _op(b, mod, "Concat", [_op(b, mod, "Slice", [shape, _c(b, mod, "n_s", [0], np.int64),
                                                           _c(b, mod, "n_e", [1], np.int64)], "n"),
                                      _c(b, mod, "dgg", [d, g, g], np.int64), hw], "x6_shape", axis=0)
    x6 = _op(b, mod, "Reshape", [xs[0], x6_shape], "x6")                     # (N, D, G, G, H, W)
    n_i = _op(b, mod, "Gather", [shape, _c(b, mod, "n_idx", 0, np.int64)], "n_scalar")
    img = _op(b, mod, "Range", [_c(b, mod, "img_zero", 0, np.int64), n_i, _c(b, mod, "img_one", 1, np.int64)], "img")
    bidx = _op(b, mod, "Cast", [cols[0]], "bidx", to=7)                      # (R, 1)
    onehot = _op(b, mod, "Cast", [_op(b, mod, "Equal", [bidx, img], "bsel")], "onehot", to=1)   # (R, N)
    t = _op(b, mod, "Einsum", [mh, x6], "rows", equation="rph,ncpqhw->rncpqw")
    t = _op(b, mod, "Einsum", [t, mw], "cols", equation="rncpqw,rqw->rncpq")
    s = _op(b, mod, "Einsum", [t, onehot], "sum", equation="rncpq,rn->rcpq")
    ax = _c(b, mod, "ax", [2], np.int64)
    area = _op(b, mod, "Mul", [_op(b, mod, "Unsqueeze", [_op(b, mod, "Sub", [he, hs], "bin_h"), ax], "bin_h_u"),
                               _op(b, mod, "Unsqueeze", [_op(b, mod, "Sub", [we, ws], "bin_w"),
                                                          _c(b, mod, "ax1", [1], np.int64)], "bin_w_u")], "area")
    area = _op(b, mod, "Unsqueeze", [area, _c(b, mod, "ax_c", [1], np.int64)], "area_u")   # (R, 1, G, G)
    pos = _op(b, mod, "Greater", [area, zero], "nonempty")
    safe = _op(b, mod, "Where", [pos, area, one], "area_safe")
    return b.node("Where", [pos, _op(b, mod, "Div", [s, safe], "mean"), zero], name)


@mapping("Proposal", "Python")
def _proposal(b, mod, xs, ins, outs):
    """Decode the anchors (constants at the declared size), TopK pre_nms_topn, one NMS per
    image, rows [image, x1, y1, x2, y2] (+ the scores for a second top)."""
    name = mod.caffe_name
    if getattr(mod, "sizes", None) is None:
        b.fail(mod, f"layer type {mod.caffe_type} has no ONNX mapping")
    b.static(mod)
    _, c2a, h, w = (int(v) for v in ins[0])
    a = c2a // 2
    p = h * w * a
    anc = mod.anchors(h, w, "cpu").numpy().astype(np.float32)
    pw = anc[:, 2] - anc[:, 0] + 1
    ph = anc[:, 3] - anc[:, 1] + 1
    pcx, pcy = anc[:, 0] + pw * 0.5, anc[:, 1] + ph * 0.5

    def col(tag, v):
        return _c(b, mod, tag, np.asarray(v, np.float32).reshape(p, 1))

    obj = _op(b, mod, "Slice", [xs[0], _c(b, mod, "obj_s", [a], np.int64), _c(b, mod, "obj_e", [c2a], np.int64),
                                _c(b, mod, "obj_ax", [1], np.int64)], "obj")
    obj = _op(b, mod, "Reshape", [_op(b, mod, "Transpose", [obj], "obj_t", perm=[0, 2, 3, 1]),
                                  _c(b, mod, "obj_shape", [0, p], np.int64)], "scores")          # (N, P)
    dl = _op(b, mod, "Reshape", [_op(b, mod, "Transpose", [xs[1]], "dl_t", perm=[0, 2, 3, 1]),
                                 _c(b, mod, "dl_shape", [0, p, 4], np.int64)], "deltas")         # (N, P, 4)
    dx, dy, dw, dh = b.node("Split", [dl], f"{name}_d", n_out=4, axis=2)                       # (N, P, 1)
    cx = _op(b, mod, "Add", [_op(b, mod, "Mul", [dx, col("pw", pw)], "dxw"), col("pcx", pcx)], "cx")
    cy = _op(b, mod, "Add", [_op(b, mod, "Mul", [dy, col("ph", ph)], "dyh"), col("pcy", pcy)], "cy")
    half = _c(b, mod, "half", 0.5)
    hw_ = _op(b, mod, "Mul", [_op(b, mod, "Mul", [_op(b, mod, "Exp", [dw], "ew"), col("pw2", pw)], "bw"), half], "hbw")
    hh_ = _op(b, mod, "Mul", [_op(b, mod, "Mul", [_op(b, mod, "Exp", [dh], "eh"), col("ph2", ph)], "bh"), half], "hbh")
    # clip bounds per image: [0, trunc(width) - 1] x [0, trunc(height) - 1]
    info = _op(b, mod, "Reshape", [xs[2], _c(b, mod, "info_shape", [0, -1], np.int64)], "info")
    hw_info = _op(b, mod, "Slice", [info, _c(b, mod, "info_s", [0], np.int64), _c(b, mod, "info_e", [2], np.int64),
                                    _c(b, mod, "info_ax", [1], np.int64)], "info_hw")           # (N, 2)
    lim = _op(b, mod, "Sub", [_op(b, mod, "Floor", [hw_info], "info_floor"), _c(b, mod, "one", 1.0)], "lim")
    lim = _op(b, mod, "Unsqueeze", [lim, _c(b, mod, "lim_ax", [1], np.int64)], "lim_u")       # (N, 1, 2)
    ymax, xmax = b.node("Split", [lim], f"{name}_lim", n_out=2, axis=2)                       # (N, 1, 1)
    zero = _c(b, mod, "zero", 0.0)

    def clip(v, hi, tag):
        return _op(b, mod, "Max", [_op(b, mod, "Min", [v, hi], f"{tag}_min"), zero], tag)

    x1 = clip(_op(b, mod, "Sub", [cx, hw_], "x1r"), xmax, "x1")
    y1 = clip(_op(b, mod, "Sub", [cy, hh_], "y1r"), ymax, "y1")
    x2 = clip(_op(b, mod, "Add", [cx, hw_], "x2r"), xmax, "x2")
    y2 = clip(_op(b, mod, "Add", [cy, hh_], "y2r"), ymax, "y2")
    boxes = _op(b, mod, "Concat", [x1, y1, x2, y2], "boxes", axis=2)                          # (N, P, 4)
    k = min(mod.pre_nms, p)
    vals, idx = b.node("TopK", [obj, _c(b, mod, "pre_nms", [k], np.int64)], f"{name}_top", n_out=2, axis=1)
    idx4 = _op(b, mod, "Expand", [_op(b, mod, "Unsqueeze", [idx, _c(b, mod, "ax2", [2], np.int64)], "idx_u"),
                                  _c(b, mod, "exp4", [1, 1, 4], np.int64)], "idx4")
    cand = _op(b, mod, "GatherElements", [boxes, idx4], "cand", axis=1)                       # (N, k, 4)
    plus = _op(b, mod, "Add", [cand, _c(b, mod, "plus1", np.array([0, 0, 1, 1], np.float32))], "cand_px")
    sel = _op(b, mod, "NonMaxSuppression", [plus, _op(b, mod, "Unsqueeze", [vals, _c(b, mod, "ax1", [1], np.int64)],
                                                       "vals_u"),
                                            _c(b, mod, "post_nms", [mod.post_nms], np.int64),
                                            _c(b, mod, "iou", [mod.nms_thresh])], "nms")
    pair = _op(b, mod, "Gather", [sel, _c(b, mod, "cols", [0, 2], np.int64)], "pairs", axis=1)   # (K, 2)
    kept = _op(b, mod, "GatherND", [cand, pair], "kept")                                          # (K, 4)
    img = _op(b, mod, "Cast", [_op(b, mod, "Gather", [sel, _c(b, mod, "col0", [0], np.int64)], "img_i", axis=1)],
              "img", to=1)                                                                       # (K, 1)
    rois = b.node("Concat", [img, kept], name, axis=1)
    if mod.num_tops == 1:
        return rois
    sc = _op(b, mod, "GatherND", [vals, pair], "kept_scores")
    return rois + b.node("Unsqueeze", [sc, _c(b, mod, "sc_ax", [1], np.int64)], f"{name}_scores")


def dropout_scaled(b, mod, xs, ins, outs):
    """caffe-fast-rcnn's ``scale_train: false`` Dropout: × (1 − dropout_ratio) at test time
    (``layers_core`` writes the plain Dropout as an Identity)."""
    return b.node("Mul", [xs[0], _c(b, mod, "scale", mod.scale)], mod.caffe_name)
