"""Helpers for the ONNX layer tests: export a code-built net's float ONNX model and run it in
ONNX Runtime next to OpenCV's Caffe importer (the independent implementation of the layers)."""
from __future__ import annotations

import os

import numpy as np

from amct_torch.caffe.graph import load_caffe
from amct_torch.export.onnx.qdq import export_float_onnx
from helpers.runtimes import ort_run


def export_and_run(proto: str, model: str, inputs: dict[str, np.ndarray], outputs=None,
                   dynamic_spatial=None) -> tuple[dict[str, np.ndarray], str]:
    """Float ONNX of the net (cut at ``outputs`` if given) run in ORT; returns (outputs by
    blob name, the .onnx path)."""
    gm = load_caffe(proto, model)
    path = os.path.join(os.path.dirname(proto), "float.onnx")
    export_float_onnx(gm, path, outputs=outputs, dynamic_spatial=dynamic_spatial)
    return ort_run(path, inputs), path


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max(1, max |ref|) after matching element counts."""
    ref = np.asarray(ref, np.float32).reshape(np.shape(ours))
    return float(np.abs(ours - ref).max() / max(1.0, float(np.abs(ref).max()))) if ref.size else 0.0


def detection_sets_match(ours: np.ndarray, ref: np.ndarray, tol: float = 1e-4) -> None:
    """Detections (rows image, label, score, box) equal as sets: same labels per image, scores
    and boxes within ``tol`` (rows matched after sorting by image, label, score)."""
    a = np.asarray(ours, np.float32).reshape(-1, 7)
    b = np.asarray(ref, np.float32).reshape(-1, 7)
    assert a.shape == b.shape, (a.shape, b.shape)
    ka = a[np.lexsort((-a[:, 2], a[:, 1], a[:, 0]))]
    kb = b[np.lexsort((-b[:, 2], b[:, 1], b[:, 0]))]
    assert np.array_equal(ka[:, :2], kb[:, :2]), (ka[:, :2], kb[:, :2])
    assert np.abs(ka[:, 2:] - kb[:, 2:]).max() <= tol, np.abs(ka[:, 2:] - kb[:, 2:]).max()
