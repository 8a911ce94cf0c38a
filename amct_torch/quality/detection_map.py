"""The mAP of an SSD net's DetectionEvaluate rows, accumulated over the test iterations as the
SSD fork's solver does (Solver::TestDetection and ComputeAP), in float32.

Rows [-1, label, count, -1, -1] add to the label's ground-truth count; rows [item, label,
score, tp, fp] are its detections (tp = fp = 0: matched to a difficult box left out, skipped).
A label's AP ranks its detections by score (stable) and integrates precision over recall as
``ap_version`` says: "11point" (VOC2007), "MaxIntegral" (VOC2012, ILSVRC) or "Integral" (the
fork's default); the mAP is the mean over the labels with a count row, 0 for a label without
detections.
"""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.quality.ap_versions import AP_VERSIONS, DEFAULT_AP_VERSION

F32 = np.float32
EPS = F32(1e-6)


def average_precision(scored: list[tuple[float, int]], num_pos: int, ap_version: str) -> float:
    """AP of one label: ``scored`` its (score, tp) pairs, ``num_pos`` its ground-truth count."""
    if ap_version not in AP_VERSIONS:
        raise ValueError(f"unknown ap_version {ap_version!r} (one of {', '.join(AP_VERSIONS)})")
    if not scored or num_pos == 0:
        return 0.0
    ranked = sorted(scored, key=lambda p: -p[0])
    tp = np.cumsum([t for _, t in ranked])
    fp = np.cumsum([1 - t for _, t in ranked])
    prec = [F32(F32(t) / F32(t + f)) for t, f in zip(tp, fp)]
    rec = [F32(F32(t) / F32(num_pos)) for t in tp]
    if ap_version == "11point":
        return float(_ap_11point(prec, rec))
    if ap_version == "MaxIntegral":
        return float(_ap_max_integral(prec, rec))
    return float(_ap_integral(prec, rec))


def _ap_11point(prec: list, rec: list) -> np.float32:
    """The mean of the best precision at recall ≥ 0, 0.1, ..., 1 (the fork's loop, in float32)."""
    max_precs = [F32(0.0)] * 11
    start = len(prec) - 1
    for j in range(10, -1, -1):
        for i in range(start, -1, -1):
            if float(rec[i]) < j / 10.0:
                start = i
                if j > 0:
                    max_precs[j - 1] = max_precs[j]
                break
            if max_precs[j] < prec[i]:
                max_precs[j] = prec[i]
    ap = F32(0.0)
    for j in range(10, -1, -1):
        ap = F32(ap + F32(max_precs[j] / F32(11)))
    return ap


def _ap_max_integral(prec: list, rec: list) -> np.float32:
    """The area under the precision envelope (the best precision at any higher recall)."""
    ap = F32(0.0)
    cur_rec, cur_prec = rec[-1], prec[-1]
    for i in range(len(prec) - 2, -1, -1):
        cur_prec = max(prec[i], cur_prec)
        if abs(F32(cur_rec - rec[i])) > EPS:
            ap = F32(ap + F32(cur_prec * abs(F32(cur_rec - rec[i]))))
        cur_rec = rec[i]
    return F32(ap + F32(cur_rec * cur_prec))


def _ap_integral(prec: list, rec: list) -> np.float32:
    """The area under the precision-recall curve as ranked."""
    ap = F32(0.0)
    prev = F32(0.0)
    for i in range(len(prec)):
        if abs(F32(rec[i] - prev)) > EPS:
            ap = F32(ap + F32(prec[i] * abs(F32(rec[i] - prev))))
        prev = rec[i]
    return ap


class DetectionMap:
    """The running tallies of one DetectionEvaluate top; ``value()`` is its mAP."""

    def __init__(self, ap_version: str = DEFAULT_AP_VERSION) -> None:
        if ap_version not in AP_VERSIONS:
            raise ValueError(f"unknown ap_version {ap_version!r} (one of {', '.join(AP_VERSIONS)})")
        self.ap_version = ap_version
        self.label = f"mAP, {ap_version}"
        self.num_pos: dict[int, int] = {}
        self.scored: dict[int, list[tuple[float, int]]] = {}

    def add(self, rows: torch.Tensor) -> None:
        """One iteration's rows (any shape holding rows of 5)."""
        for item, label, score, tp, fp in rows.detach().to("cpu", torch.float32).reshape(-1, 5).tolist():
            lab = int(label)
            if int(item) == -1:
                self.num_pos[lab] = self.num_pos.get(lab, 0) + int(score)
            elif int(tp) or int(fp):
                self.scored.setdefault(lab, []).append((float(F32(score)), int(tp)))

    def per_class(self) -> dict[int, float]:
        """label -> AP, for the labels with a count row."""
        return {lab: average_precision(self.scored.get(lab, []), n, self.ap_version)
                for lab, n in sorted(self.num_pos.items())}

    def value(self) -> float:
        aps = self.per_class()
        if not aps:
            return float("nan")
        total = F32(0.0)
        for ap in aps.values():
            total = F32(total + F32(ap))
        return float(F32(total / F32(len(aps))))
