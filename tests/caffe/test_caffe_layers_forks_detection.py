"""The segmentation / detection forks' layers (Interp, MVN, Reorg, ROIPooling, PSROIPooling,
Proposal and py-faster-rcnn's Python proposal) against OpenCV's Caffe importer, and against
numpy references written here from the forks' C++ where OpenCV differs from the fork or does
not implement a parameter: Interp's shrink_factor and pad_beg/pad_end (OpenCV ignores them),
MVN's eps (BVLC adds it after the square root, OpenCV inside it), Reorg strides other than 2
(OpenCV reads ``reorg_stride``, not the forks' ``reorg_param.stride``), batches of more than one
image for the ROI layers (OpenCV runs batch 1). Odd sizes throughout."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from amct_torch.errors import ModelError
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

# -- references written from the forks' code ----------------------------------------------


def interp_ref(x: np.ndarray, ho: int, wo: int, pad_beg: int = 0, pad_end: int = 0) -> np.ndarray:
    """PSPNet's caffe_cpu_interp2 after cropping by the (non-positive) pads."""
    h, w = x.shape[2] + pad_beg + pad_end, x.shape[3] + pad_beg + pad_end
    src = x[:, :, -pad_beg:-pad_beg + h, -pad_beg:-pad_beg + w].astype(np.float64)
    rh = (h - 1) / (ho - 1) if ho > 1 else 0.0
    rw = (w - 1) / (wo - 1) if wo > 1 else 0.0
    out = np.zeros(x.shape[:2] + (ho, wo))
    for i in range(ho):
        fy = rh * i
        y0 = int(fy)
        dy = 1 if y0 < h - 1 else 0
        ly = fy - y0
        for j in range(wo):
            fx = rw * j
            x0 = int(fx)
            dx = 1 if x0 < w - 1 else 0
            lx = fx - x0
            out[:, :, i, j] = ((1 - ly) * ((1 - lx) * src[:, :, y0, x0] + lx * src[:, :, y0, x0 + dx])
                               + ly * ((1 - lx) * src[:, :, y0 + dy, x0] + lx * src[:, :, y0 + dy, x0 + dx]))
    return out.astype(np.float32)


def mvn_ref(x: np.ndarray, across: bool, norm_var: bool, eps: float) -> np.ndarray:
    """BVLC MVN: x - mean, divided by sqrt(var) + eps."""
    axes = tuple(range(1 if across else 2, x.ndim))
    d = x.astype(np.float64) - x.mean(axis=axes, keepdims=True)
    if norm_var:
        d = d / (np.sqrt((d * d).mean(axis=axes, keepdims=True)) + eps)
    return d.astype(np.float32)


def reorg_ref(x: np.ndarray, s: int) -> np.ndarray:
    """darknet's reorg_cpu (forward = 0) as OpenCV's ReorgLayer loops it."""
    n, c, h, w = x.shape
    out = np.zeros(x.size, np.float32)
    oc = c // (s * s)
    for b in range(n):
        src = x[b].reshape(-1)
        base = b * c * h * w
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    c2, off = k % oc, k // oc
                    w2, h2 = i * s + off % s, j * s + off // s
                    out[base + i + w * (j + h * k)] = src[w2 + w * s * (h2 + h * s * c2)]
    return out.reshape(n, c * s * s, h // s, w // s)


def c_round(v: float) -> float:
    return math.copysign(math.floor(abs(v) + 0.5), v)


def roi_pool_ref(x: np.ndarray, rois: np.ndarray, ph_: int, pw_: int, scale: float) -> np.ndarray:
    """py-faster-rcnn's ROIPoolingLayer::Forward_cpu (float32 arithmetic)."""
    f = np.float32
    out = np.zeros((len(rois), x.shape[1], ph_, pw_), np.float32)
    h, w = x.shape[2:]
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (c_round(float(f(roi[k]) * f(scale))) for k in (1, 2, 3, 4))
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = f(rh) / f(ph_), f(rw) / f(pw_)
        for ph in range(ph_):
            for pw in range(pw_):
                hs = min(max(int(math.floor(f(ph) * bh)) + int(y1), 0), h)
                he = min(max(int(math.ceil(f(ph + 1) * bh)) + int(y1), 0), h)
                ws = min(max(int(math.floor(f(pw) * bw)) + int(x1), 0), w)
                we = min(max(int(math.ceil(f(pw + 1) * bw)) + int(x1), 0), w)
                if he > hs and we > ws:
                    out[r, :, ph, pw] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
    return out


def psroi_ref(x: np.ndarray, rois: np.ndarray, dim: int, g: int, scale: float) -> np.ndarray:
    """R-FCN's PSROIPoolingForward (float32 arithmetic)."""
    f = np.float32
    out = np.zeros((len(rois), dim, g, g), np.float32)
    h, w = x.shape[2:]
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1 = f(c_round(float(roi[1]))) * f(scale), f(c_round(float(roi[2]))) * f(scale)
        x2, y2 = f(c_round(float(roi[3])) + 1) * f(scale), f(c_round(float(roi[4])) + 1) * f(scale)
        bh, bw = max(y2 - y1, f(0.1)) / f(g), max(x2 - x1, f(0.1)) / f(g)
        for c in range(dim):
            for ph in range(g):
                for pw in range(g):
                    hs = min(max(int(math.floor(f(ph) * bh + y1)), 0), h)
                    he = min(max(int(math.ceil(f(ph + 1) * bh + y1)), 0), h)
                    ws = min(max(int(math.floor(f(pw) * bw + x1)), 0), w)
                    we = min(max(int(math.ceil(f(pw + 1) * bw + x1)), 0), w)
                    if he > hs and we > ws:
                        out[r, c, ph, pw] = x[b, (c * g + ph) * g + pw, hs:he, ws:we].mean()
    return out


# -- Interp ---------------------------------------------------------------------------------
INTERP = 'layer {{ name: "y" type: "Interp" bottom: "data" top: "y" interp_param {{ {} }} }}'


@pytest.mark.parametrize("param,shape,size", [
    ("zoom_factor: 2", (1, 3, 5, 7), (9, 13)),
    ("zoom_factor: 3", (2, 2, 4, 1), (10, 1)),
    ("height: 13 width: 6", (1, 3, 5, 7), (13, 6)),
    ("height: 1 width: 1", (1, 2, 5, 7), (1, 1)),
    ("height: 33 width: 17", (1, 4, 8, 9), (33, 17)),
])
def test_interp_matches_opencv(tmp_path, param, shape, size):
    p, m = make_net(tmp_path, INTERP.format(param), {"data": shape})
    x = rand(*shape, seed=3)
    ours = run_ours(p, m, x)["y"]
    assert ours.shape[2:] == size
    assert_close(ours, run_cv(p, m, {"data": x}, ["y"])["y"])
    assert_close(ours, interp_ref(x, *size))


@pytest.mark.parametrize("param,shape,size,pads", [
    ("shrink_factor: 2", (1, 3, 9, 8), (5, 4), (0, 0)),
    ("shrink_factor: 3", (1, 2, 7, 11), (3, 4), (0, 0)),
    ("zoom_factor: 2 pad_beg: -1 pad_end: -1", (1, 3, 9, 7), (13, 9), (-1, -1)),
    ("zoom_factor: 8 pad_beg: 0 pad_end: -2", (1, 2, 6, 5), (25, 17), (0, -2)),
    ("shrink_factor: 2 zoom_factor: 3", (1, 3, 9, 7), (13, 10), (0, 0)),
    ("height: 6 width: 4 pad_beg: -2", (1, 1, 9, 7), (6, 4), (-2, 0)),
])
def test_interp_fork_parameters_match_reference(tmp_path, param, shape, size, pads):
    """OpenCV ignores shrink_factor and the pads: PSPNet's own arithmetic is the reference."""
    p, m = make_net(tmp_path, INTERP.format(param), {"data": shape})
    x = rand(*shape, seed=4)
    ours = run_ours(p, m, x)["y"]
    assert ours.shape[2:] == size
    assert_close(ours, interp_ref(x, *size, *pads))


def test_interp_second_bottom_gives_the_size(tmp_path):
    body = ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            'layer { name: "y" type: "Interp" bottom: "p" bottom: "data" top: "y" }')
    p, m = make_net(tmp_path, body, {"data": (1, 2, 7, 9)})
    x = rand(1, 2, 7, 9, seed=5)
    ours = run_ours(p, m, x)["y"]
    assert ours.shape == (1, 2, 7, 9)
    pool = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf).reshape(1, 2, 4, 2, 5, 2).max(axis=(3, 5))
    assert_close(ours, interp_ref(pool, 7, 9))


@pytest.mark.parametrize("param,msg", [
    ("pad_beg: 1 zoom_factor: 2", "non-positive"),
    ("zoom_factor: 0", "zoom_factor"),
    ("shrink_factor: 0", "shrink_factor"),
    ("height: 5", "both height and width"),
    ("", "needs zoom_factor"),
])
def test_interp_bad_parameters_name_file_and_layer(tmp_path, param, msg):
    p, m = make_net(tmp_path, INTERP.format(param), {"data": (1, 1, 4, 4)})
    with pytest.raises(ModelError, match=msg) as e:
        run_ours(p, m, rand(1, 1, 4, 4))
    assert e.value.layer == "y" and str(p) in str(e.value)


def test_interp_crop_to_nothing_is_refused(tmp_path):
    p, m = make_net(tmp_path, INTERP.format("zoom_factor: 2 pad_beg: -2 pad_end: -2"), {"data": (1, 1, 4, 4)})
    with pytest.raises(ModelError, match="crops"):
        run_ours(p, m, rand(1, 1, 4, 4))


# -- MVN ------------------------------------------------------------------------------------
MVN = 'layer {{ name: "y" type: "MVN" bottom: "data" top: "y" mvn_param {{ {} }} }}'


@pytest.mark.parametrize("param,across,norm", [
    ("", False, True), ("across_channels: true", True, True),
    ("normalize_variance: false", False, False), ("normalize_variance: false across_channels: true", True, False),
])
def test_mvn_matches_opencv(tmp_path, param, across, norm):
    p, m = make_net(tmp_path, MVN.format(param), {"data": (2, 3, 5, 7)})
    x = rand(2, 3, 5, 7, seed=6) * 3 + 1
    ours = run_ours(p, m, x)["y"]
    assert_close(ours, run_cv(p, m, {"data": x}, ["y"])["y"])
    assert_close(ours, mvn_ref(x, across, norm, 1e-9))


@pytest.mark.parametrize("across", [False, True])
def test_mvn_eps_after_the_root_as_bvlc(tmp_path, across):
    """With a large eps BVLC's sqrt(var) + eps is the reference; OpenCV's sqrt(var + eps)
    measurably differs (documented)."""
    p, m = make_net(tmp_path, MVN.format(f"eps: 0.1 across_channels: {str(across).lower()}"), {"data": (2, 3, 5, 7)})
    x = rand(2, 3, 5, 7, seed=7)
    ours = run_ours(p, m, x)["y"]
    assert_close(ours, mvn_ref(x, across, True, 0.1))
    assert np.abs(ours - run_cv(p, m, {"data": x}, ["y"])["y"]).max() > 1e-3


# -- Reorg ----------------------------------------------------------------------------------
REORG = 'layer {{ name: "y" type: "Reorg" bottom: "data" top: "y" reorg_param {{ {} }} }}'


@pytest.mark.parametrize("shape", [(1, 8, 6, 10), (2, 4, 2, 2), (1, 12, 26, 14)])
def test_reorg_matches_opencv(tmp_path, shape):
    p, m = make_net(tmp_path, REORG.format("stride: 2"), {"data": shape})
    x = rand(*shape, seed=8)
    ours = run_ours(p, m, x)["y"]
    assert ours.shape == (shape[0], shape[1] * 4, shape[2] // 2, shape[3] // 2)
    assert_close(ours, run_cv(p, m, {"data": x}, ["y"])["y"], tol=0)
    assert_close(ours, reorg_ref(x, 2), tol=0)


@pytest.mark.parametrize("stride,shape", [(3, (1, 18, 6, 9)), (1, (1, 3, 5, 7)), (4, (2, 16, 8, 4))])
def test_reorg_other_strides_match_darknet(tmp_path, stride, shape):
    p, m = make_net(tmp_path, REORG.format(f"stride: {stride}"), {"data": shape})
    x = rand(*shape, seed=9)
    assert_close(run_ours(p, m, x)["y"], reorg_ref(x, stride), tol=0)


@pytest.mark.parametrize("param,shape,msg", [
    ("stride: 2", (1, 6, 4, 4), "divisible"), ("stride: 2", (1, 8, 5, 4), "divisible"),
    ("stride: 0", (1, 4, 4, 4), "stride"), ("reverse: true", (1, 4, 4, 4), "reverse"),
])
def test_reorg_bad_parameters(tmp_path, param, shape, msg):
    p, m = make_net(tmp_path, REORG.format(param), {"data": shape})
    with pytest.raises(ModelError, match=msg) as e:
        run_ours(p, m, rand(*shape))
    assert e.value.layer == "y"


# -- ROIPooling / PSROIPooling --------------------------------------------------------------
def make_rois(n_rois: int, h: int, w: int, stride: float, n: int = 1, seed: int = 0) -> np.ndarray:
    """ROIs in image pixels, some outside the image, one on exact .5 corners (C's round)."""
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-10, w * stride, n_rois)
    y1 = rng.uniform(-10, h * stride, n_rois)
    rois = np.stack([rng.integers(0, n, n_rois), x1, y1, x1 + rng.uniform(0, w * stride / 2, n_rois),
                     y1 + rng.uniform(0, h * stride / 2, n_rois)], 1).astype(np.float32)
    rois[0, 1:] = [8.5, 7.5, 40.5, 33.5]
    rois[1, 1:] = [2.0, 3.0, 2.0, 3.0]  # a one-pixel ROI
    return rois


ROIP = 'layer {{ name: "y" type: "ROIPooling" bottom: "data" bottom: "rois" top: "y" roi_pooling_param {{ {} }} }}'
PSROI = 'layer {{ name: "y" type: "PSROIPooling" bottom: "data" bottom: "rois" top: "y" psroi_pooling_param {{ {} }} }}'


@pytest.mark.parametrize("ph,pw,scale,shape,n_rois", [
    (7, 7, 0.0625, (1, 5, 13, 17), 20), (3, 5, 0.125, (1, 4, 11, 9), 9), (6, 6, 0.0625, (1, 3, 14, 14), 7),
])
def test_roi_pooling_matches_opencv(tmp_path, ph, pw, scale, shape, n_rois):
    rois = make_rois(n_rois, shape[2], shape[3], 1 / scale)
    p, m = make_net(tmp_path, ROIP.format(f"pooled_h: {ph} pooled_w: {pw} spatial_scale: {scale}"),
                    {"data": shape, "rois": rois.shape})
    x = rand(*shape, seed=10)
    ours = run_ours(p, m, x, rois)["y"]
    assert ours.shape == (n_rois, shape[1], ph, pw)
    assert_close(ours, run_cv(p, m, {"data": x, "rois": rois}, ["y"])["y"], tol=0)
    assert_close(ours, roi_pool_ref(x, rois, ph, pw, scale), tol=0)


def test_roi_pooling_batch_of_two_matches_reference(tmp_path):
    rois = make_rois(12, 10, 12, 16, n=2, seed=1)
    p, m = make_net(tmp_path, ROIP.format("pooled_h: 2 pooled_w: 3 spatial_scale: 0.0625"),
                    {"data": (2, 3, 10, 12), "rois": rois.shape})
    x = rand(2, 3, 10, 12, seed=11)
    assert_close(run_ours(p, m, x, rois)["y"], roi_pool_ref(x, rois, 2, 3, 0.0625), tol=0)


@pytest.mark.parametrize("dim,g,scale,shape,n_rois", [
    (3, 3, 0.0625, (1, 27, 13, 17), 20), (2, 2, 0.125, (1, 8, 11, 9), 9), (4, 7, 0.0625, (1, 196, 9, 11), 5),
])
def test_psroi_pooling_matches_opencv(tmp_path, dim, g, scale, shape, n_rois):
    rois = make_rois(n_rois, shape[2], shape[3], 1 / scale, seed=2)
    p, m = make_net(tmp_path, PSROI.format(f"spatial_scale: {scale} output_dim: {dim} group_size: {g}"),
                    {"data": shape, "rois": rois.shape})
    x = rand(*shape, seed=12)
    ours = run_ours(p, m, x, rois)["y"]
    assert ours.shape == (n_rois, dim, g, g)
    assert_close(ours, run_cv(p, m, {"data": x, "rois": rois}, ["y"])["y"])
    assert_close(ours, psroi_ref(x, rois, dim, g, scale))


def test_psroi_pooling_batch_of_two_matches_reference(tmp_path):
    rois = make_rois(12, 10, 12, 16, n=2, seed=3)
    p, m = make_net(tmp_path, PSROI.format("spatial_scale: 0.0625 output_dim: 2 group_size: 3"),
                    {"data": (2, 18, 10, 12), "rois": rois.shape})
    x = rand(2, 18, 10, 12, seed=13)
    assert_close(run_ours(p, m, x, rois)["y"], psroi_ref(x, rois, 2, 3, 0.0625))


@pytest.mark.parametrize("body,shape,msg", [
    (ROIP.format("pooled_h: 0 pooled_w: 7"), (1, 3, 8, 8), "pooled_h"),
    (ROIP.format("pooled_h: 2 pooled_w: 2 spatial_scale: -1"), (1, 3, 8, 8), "spatial_scale"),
    (PSROI.format("spatial_scale: 0.0625 output_dim: 2"), (1, 8, 8, 8), "group_size"),
    (PSROI.format("spatial_scale: 0.0625 output_dim: 2 group_size: 3"), (1, 8, 8, 8), "18 input channels"),
])
def test_roi_layers_bad_parameters(tmp_path, body, shape, msg):
    p, m = make_net(tmp_path, body, {"data": shape, "rois": (3, 5)})
    with pytest.raises(ModelError, match=msg) as e:
        run_ours(p, m, rand(*shape), make_rois(3, 8, 8, 16))
    assert e.value.layer == "y"


# -- Proposal / Python proposal -------------------------------------------------------------
PROPOSAL = ('layer {{ name: "y" type: "Proposal" bottom: "s" bottom: "d" bottom: "im_info" top: "y" '
            'proposal_param {{ {} }} }}')
PYTHON = ('layer {{ name: "y" type: "Python" bottom: "s" bottom: "d" bottom: "im_info" top: "y" '
          'python_param {{ module: "{}" layer: "{}" param_str: "{}" }} }}')
STD = "ratio: 0.5 ratio: 1 ratio: 2 scale: 8 scale: 16 scale: 32"


def rpn_inputs(a: int, h: int, w: int, im, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.uniform(0, 1, (1, 2 * a, h, w)).astype(np.float32),
            (rng.standard_normal((1, 4 * a, h, w)) * 0.3).astype(np.float32), np.array([im], np.float32))


def _proposal_vs_opencv(tmp_path, body, cv_body, a, h, w, im):
    s, d, info = rpn_inputs(a, h, w, im)
    shapes = {"s": s.shape, "d": d.shape, "im_info": info.shape}
    p, m = make_net(tmp_path, body, shapes, name="ours")
    ours = run_ours(p, m, s, d, info)["y"]
    pc, mc = make_net(tmp_path, cv_body, shapes, name="cv")
    ref = run_cv(pc, mc, {"s": s, "d": d, "im_info": info}, ["y"])["y"]
    assert ours.shape[1] == 5 and 0 < ours.shape[0] <= ref.shape[0]
    assert_close(ours, ref[: ours.shape[0]])          # OpenCV pads to post_nms_topn rows
    assert not np.abs(ref[ours.shape[0]:]).any()      # with zeros: the same count of boxes
    return ours


@pytest.mark.parametrize("param,a,h,w,im", [
    (f"feat_stride: 16 {STD} pre_nms_topn: 100 post_nms_topn: 30 nms_thresh: 0.7", 9, 5, 7, (100.7, 130.2, 1.6)),
    ("feat_stride: 8 base_size: 8 ratio: 1 scale: 2 scale: 4 pre_nms_topn: 40 post_nms_topn: 50 nms_thresh: 0.5",
     2, 9, 11, (70, 90, 1)),
    (f"feat_stride: 16 {STD}", 9, 6, 8, (95, 127, 1)),
    ("feat_stride: 4 base_size: 4 ratio: 0.5 ratio: 2 scale: 3 pre_nms_topn: 200 post_nms_topn: 10 nms_thresh: 0.3",
     2, 13, 7, (51, 27.9, 2)),
])
def test_proposal_matches_opencv(tmp_path, param, a, h, w, im):
    body = PROPOSAL.format(param)
    _proposal_vs_opencv(tmp_path, body, body, a, h, w, im)


def test_python_rpn_proposal_is_opencvs_proposal(tmp_path):
    """OpenCV's importer does not create Python layers; the same net with its Proposal type and
    py-faster-rcnn's test settings is the reference."""
    body = PYTHON.format("rpn.proposal_layer", "ProposalLayer", "'feat_stride': 16")
    cv_body = PROPOSAL.format(f"feat_stride: 16 base_size: 16 {STD} pre_nms_topn: 6000 post_nms_topn: 300 nms_thresh: 0.7")
    _proposal_vs_opencv(tmp_path, body, cv_body, 9, 7, 9, (110, 140, 1))


def test_python_rpn_proposal_scales_from_param_str(tmp_path):
    body = PYTHON.format("rpn.proposal_layer", "ProposalLayer", "'feat_stride': 8, 'scales': (2, 4)")
    cv_body = PROPOSAL.format("feat_stride: 8 ratio: 0.5 ratio: 1 ratio: 2 scale: 2 scale: 4")
    _proposal_vs_opencv(tmp_path, body, cv_body, 6, 8, 10, (64, 80, 1))


def test_proposal_second_top_has_the_scores(tmp_path):
    body = ('layer { name: "y" type: "Proposal" bottom: "s" bottom: "d" bottom: "im_info" top: "y" top: "sc" '
            f'proposal_param {{ feat_stride: 16 {STD} post_nms_topn: 20 }} }}')
    s, d, info = rpn_inputs(9, 5, 6, (80, 96, 1), seed=3)
    p, m = make_net(tmp_path, body, {"s": s.shape, "d": d.shape, "im_info": info.shape})
    out = run_ours(p, m, s, d, info)
    sc = out["sc"].reshape(-1)
    assert out["y"].shape == (20, 5) and sc.shape == (20,)
    assert np.all(np.diff(sc) <= 0) and set(sc.tolist()) <= set(s[0, 9:].reshape(-1).tolist())


def test_other_python_layer_is_refused_at_load(tmp_path):
    body = PYTHON.format("roi_data_layer.layer", "RoIDataLayer", "'num_classes': 21")
    s, d, info = rpn_inputs(9, 3, 3, (48, 48, 1))
    p, m = make_net(tmp_path, body, {"s": s.shape, "d": d.shape, "im_info": info.shape})
    from amct_torch.caffe.graph import load_caffe
    with pytest.raises(ModelError) as e:
        load_caffe(p, m)
    msg = str(e.value)
    assert e.value.layer == "y" and str(p) in msg
    for part in ("roi_data_layer.layer", "RoIDataLayer", "Replace", "--onnx-outputs", "rpn.proposal_layer.ProposalLayer"):
        assert part in msg


@pytest.mark.parametrize("param_str,msg", [("'feat_stride': 16, 'foo': 1", "foo"), ("'feat_stride': [", "param_str"),
                                           ("'scales': 'big'", "wrong type")])
def test_python_proposal_bad_param_str(tmp_path, param_str, msg):
    body = PYTHON.format("rpn.proposal_layer", "ProposalLayer", param_str)
    p, m = make_net(tmp_path, body, {"s": (1, 18, 3, 3), "d": (1, 36, 3, 3), "im_info": (1, 3)})
    from amct_torch.caffe.graph import load_caffe
    with pytest.raises(ModelError, match=msg):
        load_caffe(p, m)


@pytest.mark.parametrize("param,shapes,msg", [
    ("ratio: 1 scale: 0", None, "positive ratio"),
    ("nms_thresh: 1.5", None, "nms_thresh"),
    ("feat_stride: 0", None, "feat_stride"),
    (STD, {"s": (1, 16, 3, 3), "d": (1, 36, 3, 3), "im_info": (1, 3)}, "9 anchors"),
])
def test_proposal_bad_parameters(tmp_path, param, shapes, msg):
    shapes = shapes or {"s": (1, 18, 3, 3), "d": (1, 36, 3, 3), "im_info": (1, 3)}
    p, m = make_net(tmp_path, PROPOSAL.format(param), shapes)
    from amct_torch.caffe.graph import load_caffe
    with pytest.raises(ModelError, match=msg) as e:
        load_caffe(p, m)
    assert e.value.layer == "y"


# -- caffe-fast-rcnn's Dropout (py-faster-rcnn / R-FCN deploy nets) ---------------------------
@pytest.mark.parametrize("param,scale", [("dropout_ratio: 0.5 scale_train: false", 0.5),
                                         ("dropout_ratio: 0.3 scale_train: false", 0.7),
                                         ("dropout_ratio: 0.3", 1.0)])
def test_dropout_scale_train_false_scales_at_test_time(tmp_path, param, scale):
    body = ('layer { name: "d" type: "Dropout" bottom: "data" top: "d" dropout_param { ' + param + ' } }\n'
            'layer { name: "y" type: "Power" bottom: "d" top: "y" }')
    p, m = make_net(tmp_path, body, {"data": (2, 3, 5, 7)})
    x = rand(2, 3, 5, 7, seed=14)
    ours = run_ours(p, m, x)["y"]
    assert_close(ours, x * np.float32(scale))
    assert_close(ours, run_cv(p, m, {"data": x}, ["y"])["y"])


# -- Region (YOLOv2) --------------------------------------------------------------------------
REGION = ('layer {{ name: "perm" type: "Permute" bottom: "data" top: "perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
          'layer {{ name: "y" type: "Region" bottom: "perm" top: "y" region_param {{ classes: {c} coords: 4 {p} }} }}')
ANCHORS = np.array([1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52], np.float32)


def region_net(tmp_path, a, c, h, w, param, name="region"):
    p, m = make_net(tmp_path, REGION.format(c=c, p=param), {"data": (1, a * (5 + c), h, w)},
                    {"y": [ANCHORS[:2 * a].reshape(1, -1)]}, name=name)
    # OpenCV reads a prototxt bool only as a number (``softmax: true`` reaches it as false) and
    # the anchor count only as ``anchors`` (the forks' ``num`` / ``boxes_of_each_grid``)
    text = open(p).read().replace("softmax: true", "softmax: 1").replace("logistic: true", "logistic: 1")
    text = text.replace("boxes_of_each_grid:", "anchors:").replace("num:", "anchors:")
    cv_proto = os.path.join(str(tmp_path), f"{name}_cv.prototxt")
    open(cv_proto, "w").write(text)
    return p, m, cv_proto


@pytest.mark.parametrize("a,c,h,w,param,scale", [
    (5, 4, 13, 13, "anchors: 5 softmax: true", 2.0),
    (3, 2, 4, 5, "anchors: 3 softmax: true nms_threshold: 0 thresh: 0.1", 1.0),
    (3, 2, 7, 5, "num: 3 softmax: true thresh: 0.1", 1.0),
    (2, 3, 5, 3, "boxes_of_each_grid: 2 logistic: true nms_threshold: 0.3 thresh: 0.3", 1.0),
    (5, 20, 9, 11, "anchors: 5 softmax: true nms_threshold: 0.45 thresh: 0.05", 3.0),
])
def test_region_matches_opencv(tmp_path, a, c, h, w, param, scale):
    p, m, cv_proto = region_net(tmp_path, a, c, h, w, param)
    x = rand(1, a * (5 + c), h, w, seed=15) * scale
    ours = run_ours(p, m, x)["y"]
    ref = run_cv(cv_proto, m, {"data": x}, ["y"])["y"]
    assert ours.shape == (h * w * a, 5 + c)
    assert_close(ours, ref)
    assert np.array_equal(ours[:, 5:] > 0, ref[:, 5:] > 0)   # the same scores survive NMS


@pytest.mark.parametrize("param,blobs,msg", [
    ("anchors: 5 num: 4 softmax: true", 5, "disagree"),
    ("anchors: 5", 5, "softmax or logistic"),
    ("anchors: 5 softmax: true softmax_tree: true", 5, "softmax_tree"),
    ("anchors: 5 softmax: true", 5, "coords"),
    ("anchors: 4 softmax: true", 5, "anchor blob"),
])
def test_region_bad_parameters(tmp_path, param, blobs, msg):
    body = REGION.format(c=2, p=param)
    if msg == "coords":
        body = body.replace("coords: 4", "coords: 5")
    p, m = make_net(tmp_path, body, {"data": (1, 35, 3, 3)}, {"y": [ANCHORS[:2 * blobs].reshape(1, -1)]})
    with pytest.raises(ModelError, match=msg) as e:
        run_ours(p, m, rand(1, 35, 3, 3))
    assert e.value.layer == "y"


def test_region_input_must_be_channels_last(tmp_path):
    body = 'layer { name: "y" type: "Region" bottom: "data" top: "y" region_param { classes: 2 anchors: 5 softmax: true } }'
    p, m = make_net(tmp_path, body, {"data": (1, 35, 3, 3)}, {"y": [ANCHORS.reshape(1, -1)]})
    with pytest.raises(ModelError, match="channels last"):
        run_ours(p, m, rand(1, 35, 3, 3))


# -- the same modules on CUDA --------------------------------------------------------------
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_fork_layers_on_cuda_match_cpu(tmp_path):
    """Every module builds its index tensors on the input's device: CUDA gives the CPU's rows."""
    cases = []
    p, m = make_net(tmp_path, INTERP.format("zoom_factor: 2 pad_beg: -1"), {"data": (1, 3, 9, 7)}, name="i")
    cases.append((p, m, [rand(1, 3, 9, 7)]))
    p, m = make_net(tmp_path, MVN.format("across_channels: true"), {"data": (2, 3, 5, 7)}, name="m")
    cases.append((p, m, [rand(2, 3, 5, 7)]))
    p, m = make_net(tmp_path, REORG.format("stride: 2"), {"data": (1, 8, 6, 10)}, name="r")
    cases.append((p, m, [rand(1, 8, 6, 10)]))
    rois = make_rois(12, 10, 12, 16, n=2)
    for i, body in enumerate((ROIP.format("pooled_h: 3 pooled_w: 2 spatial_scale: 0.0625"),
                              PSROI.format("spatial_scale: 0.0625 output_dim: 2 group_size: 3"))):
        c = 3 if i == 0 else 18
        p, m = make_net(tmp_path, body, {"data": (2, c, 10, 12), "rois": rois.shape}, name=f"roi{i}")
        cases.append((p, m, [rand(2, c, 10, 12), rois]))
    s, d, info = rpn_inputs(9, 5, 7, (100, 130, 1))
    p, m = make_net(tmp_path, PROPOSAL.format(STD), {"s": s.shape, "d": d.shape, "im_info": info.shape}, name="p")
    cases.append((p, m, [s, d, info]))
    p, m, _ = region_net(tmp_path, 5, 4, 13, 13, "anchors: 5 softmax: true")
    cases.append((p, m, [rand(1, 45, 13, 13) * 2]))
    for p, m, xs in cases:
        cpu, gpu = run_ours(p, m, *xs), run_ours(p, m, *xs, device="cuda")
        for k in cpu:
            assert cpu[k].shape == gpu[k].shape
            assert_close(gpu[k], cpu[k], tol=1e-5)
