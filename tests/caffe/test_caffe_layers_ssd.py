"""SSD layers (PriorBox, DetectionOutput) against OpenCV and a plain Python reference."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

PRIOR_CASES = [
    "min_size: 30 max_size: 60 aspect_ratio: 2 flip: true clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2",
    "min_size: 20 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: true variance: 0.1",
    "min_size: 16 max_size: 40 aspect_ratio: 2 flip: false step: 8 offset: 0.5 variance: 0.2",
]


def prior_reference(params_h, params_w, img_h, img_w, min_sizes, max_sizes, ars, flip, clip, var, step=None, offset=0.5):
    """SSD PriorBoxLayer::Forward_cpu, written out with loops."""
    ar_list = [1.0]
    for a in ars:
        if any(abs(a - b) < 1e-6 for b in ar_list):
            continue
        ar_list.append(a)
        if flip:
            ar_list.append(1.0 / a)
    sh = step or img_h / params_h
    sw = step or img_w / params_w
    boxes = []
    for h in range(params_h):
        for w in range(params_w):
            cx, cy = (w + offset) * sw, (h + offset) * sh
            for i, mn in enumerate(min_sizes):
                sizes = [(mn, mn)]
                if max_sizes:
                    s = math.sqrt(mn * max_sizes[i])
                    sizes.append((s, s))
                sizes += [(mn * math.sqrt(a), mn / math.sqrt(a)) for a in ar_list if abs(a - 1) >= 1e-6]
                for bw, bh in sizes:
                    boxes += [(cx - bw / 2) / img_w, (cy - bh / 2) / img_h, (cx + bw / 2) / img_w, (cy + bh / 2) / img_h]
    boxes = np.array(boxes, np.float32)
    if clip:
        boxes = np.clip(boxes, 0, 1)
    v = np.tile(np.array(var * 4 if len(var) == 1 else var, np.float32), len(boxes) // 4)
    return np.stack([boxes, v])[None]


@pytest.mark.parametrize("params", PRIOR_CASES)
def test_priorbox(tmp_path, params, device):
    body = f'layer {{ name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" prior_box_param {{ {params} }} }}'
    proto, model = make_net(tmp_path, body, {"feat": (1, 2, 5, 6), "data": (1, 3, 50, 64)})
    f, x = rand(1, 2, 5, 6, seed=1), rand(1, 3, 50, 64, seed=2)
    ours = run_ours(proto, model, f, x, device=device)["pb"]

    def vals(key):
        return [float(v.split()[0]) for v in params.split(f"{key}: ")[1:]]
    ref = prior_reference(5, 6, 50, 64, vals("min_size"), vals("max_size"), vals("aspect_ratio"),
                          "flip: true" in params, "clip: true" in params, vals("variance"),
                          step=(vals("step") or [None])[0])
    assert ours.shape == ref.shape
    assert_close(ours, ref, 1e-6)
    if "clip: true" in params or (ref[0, 0] >= 0).all():  # OpenCV cuts negative corners at 0 regardless
        assert_close(ours, run_cv(proto, model, {"feat": f, "data": x}, ["pb"])["pb"], 1e-6)


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def detection_reference(loc, conf, prior, num_classes, thr, nms_thr, top_k, keep_top_k):
    """Plain-Python SSD DetectionOutput (share_location, CENTER_SIZE, background 0)."""
    n, p = loc.shape[0], prior.shape[2] // 4
    pb, pv = prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4)
    rows = []
    for i in range(n):
        l = loc[i].reshape(p, 4)
        c = conf[i].reshape(p, num_classes)
        boxes = []
        for j in range(p):
            pw, ph = pb[j, 2] - pb[j, 0], pb[j, 3] - pb[j, 1]
            cx = pv[j, 0] * l[j, 0] * pw + (pb[j, 0] + pb[j, 2]) / 2
            cy = pv[j, 1] * l[j, 1] * ph + (pb[j, 1] + pb[j, 3]) / 2
            w, h = math.exp(pv[j, 2] * l[j, 2]) * pw, math.exp(pv[j, 3] * l[j, 3]) * ph
            boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
        dets = []
        for k in range(1, num_classes):
            cand = sorted([j for j in range(p) if c[j, k] > thr], key=lambda j: -c[j, k])[:top_k]
            kept = []
            for j in cand:
                if all(_iou(boxes[j], boxes[q]) <= nms_thr for q in kept):
                    kept.append(j)
            dets += [(k, float(c[j, k]), boxes[j]) for j in kept]
        if len(dets) > keep_top_k:
            dets = sorted(dets, key=lambda d: -d[1])[:keep_top_k]
        rows += [[i, k, s, *b] for k, s, b in sorted(dets, key=lambda d: (d[0], -d[1]))]
    return np.array(rows, np.float32).reshape(1, 1, -1, 7)


def test_detection_output(tmp_path, device):
    nc, h, w = 4, 4, 5
    pparams = "min_size: 10 max_size: 20 aspect_ratio: 2 flip: true clip: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2"
    body = (f'layer {{ name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" prior_box_param {{ {pparams} }} }}\n'
            f'layer {{ name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pb" top: "det" '
            f'detection_output_param {{ num_classes: {nc} share_location: true background_label_id: 0 '
            f'nms_param {{ nms_threshold: 0.45 top_k: 40 }} code_type: CENTER_SIZE keep_top_k: 25 '
            f'confidence_threshold: 0.2 }} }}')
    num_p = h * w * 4
    inputs = {"feat": (2, 8, h, w), "data": (2, 3, 40, 50), "loc": (2, num_p * 4), "conf": (2, num_p * nc)}
    proto, model = make_net(tmp_path, body, inputs)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, num_p, nc)) * 2
    conf = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32).reshape(2, -1)
    loc = (rng.standard_normal((2, num_p * 4)) * 0.5).astype(np.float32)
    feat, data = rand(2, 8, h, w, seed=1), rand(2, 3, 40, 50, seed=2)
    out = run_ours(proto, model, feat, data, loc, conf, device=device)
    ours = out["det"]
    import torch

    from amct_torch.caffe import layer_modules, load_caffe
    gm = load_caffe(proto, model)
    pb = layer_modules(gm)["pb"](torch.from_numpy(feat), torch.from_numpy(data)).numpy()
    ref = detection_reference(loc, conf, pb, nc, 0.2, 0.45, 40, 25)
    assert ours.shape == ref.shape and ours.shape[2] > 5
    assert_close(ours, ref, 1e-5)
    cv = run_cv(proto, model, {"feat": feat, "data": data, "loc": loc, "conf": conf}, ["det"])["det"]
    cv_rows = cv.reshape(-1, 7)
    ours_rows = ours.reshape(-1, 7)
    key = lambda r: (r[0], r[1], -r[2])
    assert_close(np.array(sorted(ours_rows.tolist(), key=key)), np.array(sorted(cv_rows.tolist(), key=key)), 1e-5)


def test_detection_output_nothing_found(tmp_path):
    body = ('layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pb" top: "det" '
            'detection_output_param { num_classes: 2 nms_param { nms_threshold: 0.5 } confidence_threshold: 0.99 } }')
    proto, model = make_net(tmp_path, body, {"loc": (2, 8), "conf": (2, 4), "pb": (1, 2, 8)})
    pb = np.array([[[0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.9, 0.9], [0.1] * 8]], np.float32)
    out = run_ours(proto, model, np.zeros((2, 8), np.float32), np.full((2, 4), 0.5, np.float32), pb)["det"]
    assert out.shape == (1, 1, 2, 7)
    assert out[0, 0, :, 0].tolist() == [0, 1] and (out[0, 0, :, 1:] == -1).all()
