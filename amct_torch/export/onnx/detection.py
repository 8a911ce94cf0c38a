"""SSD DetectionOutput as standard ONNX ops: box decoding, per-class top_k, NonMaxSuppression and
keep_top_k, with weiliu89/caffe's semantics (docs/export.md lists what differs).

Why this shape: ONNX's NonMaxSuppression caps the boxes it keeps per class, Caffe's ApplyNMSFast
caps the candidates before NMS. So the candidates are taken first with TopK per (image, class),
each pair is one single-class NMS batch, and keep_top_k is a TopK over a dense score matrix in
which only kept boxes hold their score, giving Caffe's output order. The priors must be a
constant (a folded PriorBox), as in every SSD deploy net."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from amct_torch.caffe.layers.ssd import CENTER_SIZE, CORNER, CORNER_SIZE

_NEG_INF = np.float32(-np.inf)


class _Writer:
    """The builder, the layer and its name: initializers and nodes named ``{layer}_{tag}``."""

    def __init__(self, b, mod) -> None:
        self.b, self.mod, self.name = b, mod, mod.caffe_name

    def const(self, tag: str, arr, dt=np.float32) -> str:
        return self.b.init(f"{self.name}_{tag}", np.asarray(arr, dt))

    def op(self, kind: str, ins: list[str], tag: str, **kw) -> str:
        return self.b.node(kind, ins, f"{self.name}_{tag}", **kw)[0]


def write_detection_output(b, mod, xs: list[str]) -> str:
    """Write ``mod`` (a DetectionOutputLayer) reading loc, conf, priors ``xs``; returns the name
    of its (1, 1, D, 7) output."""
    prior, classes = _check_supported(b, mod, xs)
    w = _Writer(b, mod)
    boxes, cls_idx = _boxes_per_class(w, _decode_boxes(w, xs[0], prior), classes)
    cand, vals, kk, nms_thr = _candidates(w, xs[1], boxes, cls_idx, prior.shape[-1] // 4)
    dense, m = _nms_scores(w, cand, vals, kk, nms_thr, len(classes))
    rows, flat, ax1 = _kept_rows(w, dense, cand, classes, kk, m)
    return _rows_or_none(w, xs[1], rows, flat, ax1)


def _check_supported(b, mod, xs: list[str]) -> tuple[np.ndarray, list[int]]:
    """The constant priors and the classes other than the background; a layer ONNX cannot
    express (adaptive NMS, priors computed at run time, an unknown code type) is refused."""
    if mod.eta < 1.0:
        b.fail(mod, f"DetectionOutput with adaptive NMS (eta {mod.eta} < 1) has no ONNX equivalent; "
                    "export the net up to the layers before it (--onnx-outputs)")
    prior = b.constants.get(xs[2])
    if prior is None:
        b.fail(mod, "DetectionOutput's priors must come from a PriorBox layer (a constant) for ONNX")
    if mod.code_type not in (CORNER, CENTER_SIZE, CORNER_SIZE):
        b.fail(mod, f"unknown code_type {mod.code_type}")
    classes = [c for c in range(mod.num_classes) if c != mod.background]
    if not classes:
        b.fail(mod, "DetectionOutput has no class other than the background")
    return prior, classes


def _decode_boxes(w: _Writer, loc_in: str, prior: np.ndarray) -> str:
    """The boxes decoded from the loc offsets against the constant priors (shaped (P, 1, 1)
    per coordinate): (N, L, P, 4) corners, L = 1 with a shared location, else one per class."""
    mod, op, const = w.mod, w.op, w.const
    num_p = prior.shape[-1] // 4
    n_loc = 1 if mod.share_location else mod.num_classes
    loc = op("Reshape", [loc_in, const("loc_shape", [0, num_p, n_loc, 4], np.int64)], "loc")
    parts = w.b.node("Split", [loc, const("split4", [1, 1, 1, 1], np.int64)], f"{w.name}_loc", n_out=4, axis=3)
    pb = prior[0, 0].reshape(num_p, 4).astype(np.float32)
    var = np.ones((num_p, 4), np.float32) if mod.encoded else prior[0, 1].reshape(num_p, 4).astype(np.float32)

    def col(tag, v):
        return const(tag, np.asarray(v, np.float32).reshape(num_p, 1, 1))

    pw, ph = pb[:, 2] - pb[:, 0], pb[:, 3] - pb[:, 1]
    if mod.code_type in (CORNER, CORNER_SIZE):
        coords = []
        for k in range(4):
            t = op("Mul", [parts[k], col(f"var{k}", var[:, k])], f"lv{k}")
            if mod.code_type == CORNER_SIZE:
                t = op("Mul", [t, col(f"size{k}", pw if k % 2 == 0 else ph)], f"lvs{k}")
            coords.append(op("Add", [t, col(f"prior{k}", pb[:, k])], f"c{k}"))
    else:
        pcx, pcy = (pb[:, 0] + pb[:, 2]) / 2, (pb[:, 1] + pb[:, 3]) / 2
        cx = op("Add", [op("Mul", [op("Mul", [parts[0], col("v0", var[:, 0])], "vx"), col("pw", pw)], "dx"),
                        col("pcx", pcx)], "cx")
        cy = op("Add", [op("Mul", [op("Mul", [parts[1], col("v1", var[:, 1])], "vy"), col("ph", ph)], "dy"),
                        col("pcy", pcy)], "cy")
        wd = op("Mul", [op("Exp", [op("Mul", [parts[2], col("v2", var[:, 2])], "vw")], "ew"), col("pw2", pw)], "w")
        h = op("Mul", [op("Exp", [op("Mul", [parts[3], col("v3", var[:, 3])], "vh")], "eh"), col("ph2", ph)], "h")
        half = const("half", 0.5)
        hw, hh = op("Mul", [wd, half], "hw"), op("Mul", [h, half], "hh")
        coords = [op("Sub", [cx, hw], "x1"), op("Sub", [cy, hh], "y1"),
                  op("Add", [cx, hw], "x2"), op("Add", [cy, hh], "y2")]
    boxes = op("Concat", coords, "boxes", axis=3)                       # (N, P, L, 4)
    return op("Transpose", [boxes], "boxes_t", perm=[0, 2, 1, 3])      # (N, L, P, 4)


def _boxes_per_class(w: _Writer, boxes: str, classes: list[int]) -> tuple[str, str]:
    """(N, C', P, 4): the boxes of each non-background class (the shared ones repeated), and
    the constant of those class indices."""
    cls_idx = w.const("classes", classes, np.int64)
    if w.mod.share_location:
        boxes = w.op("Expand", [boxes, w.const("expand_cls", [1, len(classes), 1, 1], np.int64)], "boxes_c")
    else:
        boxes = w.op("Gather", [boxes, cls_idx], "boxes_c", axis=1)      # (N, C', P, 4)
    return boxes, cls_idx


def _candidates(w: _Writer, conf_in: str, boxes: str, cls_idx: str, num_p: int) -> tuple[str, str, int, float]:
    """Caffe's NMS candidates: the top_k scores per (image, class) and their boxes
    (N, C', kk, 4), scores not above the confidence threshold set to -inf; with kk and the
    score threshold the NMS gets."""
    mod, op, const = w.mod, w.op, w.const
    conf = op("Reshape", [conf_in, const("conf_shape", [0, num_p, mod.num_classes], np.int64)], "conf")
    conf = op("Transpose", [conf], "conf_t", perm=[0, 2, 1])
    conf = op("Gather", [conf, cls_idx], "conf_c", axis=1)              # (N, C', P)
    kk = min(mod.nms_top_k, num_p) if mod.nms_top_k > -1 else num_p
    vals, idx = w.b.node("TopK", [conf, const("top_k", [kk], np.int64)], f"{w.name}_cand", n_out=2, axis=2)
    idx4 = op("Expand", [op("Unsqueeze", [idx, const("ax3", [3], np.int64)], "idx_u"),
                         const("expand4", [1, 1, 1, 4], np.int64)], "idx4")
    cand = op("GatherElements", [boxes, idx4], "cand_boxes", axis=2)   # (N, C', kk, 4)
    thr = mod.confidence_threshold
    if np.isfinite(thr):
        keep = op("Greater", [vals, const("conf_thr", thr)], "above")
        vals = op("Where", [keep, vals, const("neg_inf", _NEG_INF)], "cand_scores")
    nms_thr = float(np.float32(thr)) if np.isfinite(thr) else float(np.finfo(np.float32).min)
    return cand, vals, kk, nms_thr


def _nms_scores(w: _Writer, cand: str, vals: str, kk: int, nms_thr: float, n_keep_cls: int) -> tuple[str, int]:
    """NonMaxSuppression with one batch per (image, class); returns the dense (N, M) score
    matrix (M = classes × kk) in which only the kept boxes hold their score (-inf elsewhere)."""
    op, const = w.op, w.const
    nb = op("Reshape", [cand, const("nms_box_shape", [-1, kk, 4], np.int64)], "nms_boxes")
    ns = op("Reshape", [vals, const("nms_score_shape", [-1, 1, kk], np.int64)], "nms_scores")
    sel = op("NonMaxSuppression", [nb, ns, const("max_out", [kk], np.int64),
                                   const("iou", [w.mod.nms_threshold]), const("score_thr", [nms_thr])], "nms")
    pair = op("Gather", [sel, const("cols", [0, 2], np.int64)], "sel_pairs", axis=1)  # (K, 2)
    s2 = op("Reshape", [vals, const("s2_shape", [-1, kk], np.int64)], "scores2d")
    upd = op("GatherND", [s2, pair], "sel_scores")
    base = op("Expand", [const("neg_inf_s", _NEG_INF), op("Shape", [s2], "s2_size")], "dense0")
    dense = op("ScatterND", [base, pair, upd], "dense")
    m = n_keep_cls * kk
    return op("Reshape", [dense, const("dense_shape", [-1, m], np.int64)], "dense_nm"), m  # (N, M)


def _kept_rows(w: _Writer, dense: str, cand: str, classes: list[int], kk: int, m: int) -> tuple[str, str, str]:
    """keep_top_k per image in Caffe's order (label ascending, score descending): the (D, 7)
    rows [image, label, score, x1, y1, x2, y2]; with the (D,) flat indices of the kept boxes
    and the axis-1 constant the last phase reuses."""
    op, const = w.op, w.const
    keep_k = min(w.mod.keep_top_k, m) if w.mod.keep_top_k > -1 else m
    kv, kf = w.b.node("TopK", [dense, const("keep_top_k", [keep_k], np.int64)], f"{w.name}_keep", n_out=2, axis=1)
    valid = op("Greater", [kv, const("neg_inf_k", _NEG_INF)], "kept")
    key = op("Where", [valid, kf, const("m", m, np.int64)], "key")
    ks = w.b.node("TopK", [key, const("keep_k2", [keep_k], np.int64)], f"{w.name}_order", n_out=2,
                  axis=1, largest=0)[0]
    nz = op("Transpose", [op("NonZero", [op("Less", [ks, const("m2", m, np.int64)], "valid")], "nz")],
            "nz_t")                                                       # (D, 2): image, slot
    flat = op("GatherND", [ks, nz], "flat")                               # (D,)
    img = op("Gather", [nz, const("zero", 0, np.int64)], "img", axis=1)
    ax1 = const("ax1", [1], np.int64)
    ni = op("Concat", [op("Unsqueeze", [img, ax1], "img_u"), op("Unsqueeze", [flat, ax1], "flat_u")], "ni", axis=1)
    score = op("GatherND", [dense, ni], "score")
    label = op("Gather", [const("labels", classes), op("Div", [flat, const("kk", kk, np.int64)], "cls")], "label")
    box = op("GatherND", [op("Reshape", [cand, const("cand_shape", [0, m, 4], np.int64)], "cand_nm"), ni], "box")
    rows = op("Concat", [op("Unsqueeze", [op("Cast", [img], "img_f", to=TensorProto.FLOAT), ax1], "c0"),
                         op("Unsqueeze", [label, ax1], "c1"), op("Unsqueeze", [score, ax1], "c2"), box],
              "rows", axis=1)                                             # (D, 7)
    return rows, flat, ax1


def _rows_or_none(w: _Writer, conf_in: str, rows: str, flat: str, ax1: str) -> str:
    """The (1, 1, D, 7) output: ``rows``, or — no detection in the whole batch — one row of -1
    per image (with its image id), as Caffe writes it (an ONNX If)."""
    b, name, op, const = w.b, w.name, w.op, w.const
    n_img = op("Gather", [op("Shape", [conf_in], "in_shape"), const("zero2", 0, np.int64)], "n_img")
    empty = op("Equal", [op("Size", [flat], "d"), const("zero3", 0, np.int64)], "empty")
    then_nodes, none = _no_detection_nodes(w, n_img, ax1)
    out_rows = b.uniq(f"{name}_rows_final")
    then_g = helper.make_graph(then_nodes, f"{name}_then", [],
                               [helper.make_tensor_value_info(none, TensorProto.FLOAT, [None, 7])])
    else_out = b.uniq(f"{name}_rows_id")
    else_g = helper.make_graph([helper.make_node("Identity", [rows], [else_out], name=b.uniq(f"{name}_rows_id"))],
                               f"{name}_else", [],
                               [helper.make_tensor_value_info(else_out, TensorProto.FLOAT, [None, 7])])
    b.nodes.append(helper.make_node("If", [empty], [out_rows], name=b.uniq(f"{name}_if"),
                                    then_branch=then_g, else_branch=else_g))
    return b.node("Unsqueeze", [out_rows, const("ax01", [0, 1], np.int64)], name)[0]


def _no_detection_nodes(w: _Writer, n_img: str, ax1: str) -> tuple[list, str]:
    """The If's then-branch: ``n_img`` rows [image id, -1 × 6]; returns its nodes and output.
    (Its inputs built in the outer graph — the constants, ``n_img`` unsqueezed — come first.)"""
    b, name, op, const = w.b, w.name, w.op, w.const
    ids = b.uniq(f"{name}_ids")
    fill = b.uniq(f"{name}_fill")
    none = b.uniq(f"{name}_none")
    then_nodes = [
        helper.make_node("Range", [const("zero4", 0, np.int64), n_img, const("one", 1, np.int64)],
                         [ids + "_i"], name=b.uniq(f"{name}_range")),
        helper.make_node("Cast", [ids + "_i"], [ids + "_f"], name=b.uniq(f"{name}_ids_cast"), to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", [ids + "_f", ax1], [ids], name=b.uniq(f"{name}_ids_u")),
        helper.make_node("Concat", [op("Unsqueeze", [n_img, const("ax0", [0], np.int64)], "n_img_u"),
                                    const("six", [6], np.int64)], [fill + "_shape"],
                         name=b.uniq(f"{name}_fill_shape"), axis=0),
        helper.make_node("Expand", [const("minus_one", -1.0), fill + "_shape"], [fill],
                         name=b.uniq(f"{name}_fill")),
        helper.make_node("Concat", [ids, fill], [none], name=b.uniq(f"{name}_none"), axis=1),
    ]
    return then_nodes, none
