"""PriorBox (constant-folded) and DetectionOutput (NonMaxSuppression) in the float ONNX model
of a code-built SSD net, against OpenCV's Caffe importer, which implements both: detections
compared as sets (same image and label, score and box within 1e-4), at batch 2 (the batch is
symbolic), for each DetectionOutput and PriorBox variant."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.errors import ExportError
from amct_torch.export.onnx.qdq import export_float_onnx
from helpers.caffe_nets import run_cv, run_ours
from helpers.data import natural_images_bgr
from helpers.onnx_layers import detection_sets_match, export_and_run, rel_err
from helpers.ssd import ssd_net

VARIANTS = {
    "default": {},
    "no_share_location": {"share_location": False},
    "background_2": {"background": 2},
    # CORNER offsets are absolute: small ones keep the boxes valid (x1 < x2, see docs/export.md)
    "corner": {"code_type": "CORNER", "loc_scale": 0.05},
    "keep_top_k_truncates": {"keep_top_k": 5},
    "tight_nms": {"nms": 0.2},
}
# Compared with amct_torch's DetectionOutput/PriorBox modules (plain loops of Caffe's code,
# themselves checked against OpenCV and a Python reference in test_caffe_layers_ssd) where
# OpenCV cannot serve: it fails on share_location without a background label, on priors
# without variances, on CORNER_SIZE, crashes without top_k / keep_top_k, cuts negative prior
# corners at 0 even with clip false, and suppresses fewer boxes than Caffe's ApplyNMSFast once
# many low-score candidates take part (38 vs 40 rows at threshold 0.01; docs/export.md).
TORCH_VARIANTS = {
    "background_none": {"background": -1},
    "encoded_in_target": {"encoded": True},
    "corner_size": {"code_type": "CORNER_SIZE", "loc_scale": 0.2},
    "no_threshold_no_top_k_no_keep": {"conf_thr": None, "top_k": None, "keep_top_k": -1},
    "low_threshold": {"conf_thr": 0.01, "top_k": 10},
    "prior_step_offset_img": {"prior1": "min_size: 10 aspect_ratio: 2 flip: false step: 4 offset: 0.25",
                              "prior2": "min_size: 20 max_size: 40 img_size: 60 clip: true"},
}


def _images(n=2, size=64):
    return natural_images_bgr(size=size, count=n, seed=3) / 64.0


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_detections_match_opencv(tmp_path, variant):
    proto, model = ssd_net(tmp_path, **VARIANTS[variant])
    x = _images()
    ours, _ = export_and_run(proto, model, {"data": x})
    cv = run_cv(proto, model, {"data": x}, ["detection_out", "mbox_priorbox"])
    det = ours["detection_out"]
    assert det.shape[:2] == (1, 1) and det.shape[2] >= 2
    assert set(det[0, 0, :, 0].astype(int)) == {0, 1}  # both images have detections
    detection_sets_match(det, cv["detection_out"])
    if variant == "keep_top_k_truncates":
        assert det.shape[2] == 10  # 5 per image


@pytest.mark.parametrize("variant", list(TORCH_VARIANTS), ids=list(TORCH_VARIANTS))
def test_detections_match_torch_module(tmp_path, variant):
    proto, model = ssd_net(tmp_path, **TORCH_VARIANTS[variant])
    x = _images()
    ours, _ = export_and_run(proto, model, {"data": x})
    ref = run_ours(proto, model, x)["detection_out"]
    assert ours["detection_out"].shape[2] >= 2
    detection_sets_match(ours["detection_out"], ref)


def test_priors_and_heads_match_opencv(tmp_path):
    """The folded priors and the float heads (Normalize, Permute, Flatten, Concat, Reshape,
    Softmax over the class axis) up to the DetectionOutput inputs (``outputs`` cut)."""
    proto, model = ssd_net(tmp_path)
    x = _images()
    blobs = ["mbox_loc", "mbox_conf_flatten", "mbox_priorbox", "conv2_norm"]
    ours, _ = export_and_run(proto, model, {"data": x}, outputs=blobs)
    cv = run_cv(proto, model, {"data": x}, blobs)
    for b in blobs:
        assert rel_err(ours[b], cv[b]) <= 1e-4, b
    assert set(ours) == set(blobs)


def test_no_detection_rows(tmp_path):
    """Nothing above the threshold in the whole batch: one row of -1 per image (Caffe's rule)."""
    proto, model = ssd_net(tmp_path, conf_thr=0.999)
    ours, _ = export_and_run(proto, model, {"data": _images(3)})
    want = np.array([[i, -1, -1, -1, -1, -1, -1] for i in range(3)], np.float32)
    assert np.array_equal(ours["detection_out"].reshape(-1, 7), want)


def test_adaptive_nms_needs_a_cut(tmp_path):
    """eta < 1 has no ONNX equivalent: an error naming the layer, and the cut before it works."""
    proto, model = ssd_net(tmp_path, eta=0.9)
    gm = load_caffe(proto, model)
    with pytest.raises(ExportError) as err:
        export_float_onnx(gm, str(tmp_path / "m.onnx"), file=proto)
    assert "detection_out" in str(err.value) and "eta" in str(err.value) and proto in str(err.value)
    assert not (tmp_path / "m.onnx").exists()
    ours, _ = export_and_run(proto, model, {"data": _images()}, outputs=["mbox_loc", "mbox_conf_flatten"])
    assert set(ours) == {"mbox_loc", "mbox_conf_flatten"}
