"""The SSD fork's DetectionEvaluate: the TEST-phase head of an SSD net.

It compares DetectionOutput's rows (item, label, score, xmin, ymin, xmax, ymax) with the
AnnotatedData label rows (item, label, instance, xmin, ymin, xmax, ymax, difficult) and gives
the fork's evaluation rows (1, 1, R, 5): first, per class but the background, [-1, class,
ground-truth count, -1, -1]; then per detection [item, label, score, tp, fp], the detections of
an item and label matched greedily, best score first, to the ground-truth box of largest IoU
(a hit of at least ``overlap_threshold`` on a box not yet taken is a true positive). The mAP is
made from the rows accumulated over the iterations (quality/detection_map.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from amct_torch.caffe.layers.base import register
from amct_torch.caffe.layers.metrics import HeadLayer

F32 = np.float32
Box = tuple[np.float32, np.float32, np.float32, np.float32]


def box_size(b: Box) -> np.float32:
    """The fork's BBoxSize of a normalised box: 0 when it is inverted."""
    if b[2] < b[0] or b[3] < b[1]:
        return F32(0.0)
    return F32((b[2] - b[0]) * (b[3] - b[1]))


def jaccard(a: Box, b: Box) -> np.float32:
    """The fork's JaccardOverlap of two normalised boxes, in float32."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F32(0.0)
    w = F32(min(a[2], b[2]) - max(a[0], b[0]))
    h = F32(min(a[3], b[3]) - max(a[1], b[1]))
    if w <= 0 or h <= 0:
        return F32(0.0)
    inter = F32(w * h)
    return F32(inter / F32(box_size(a) + box_size(b) - inter))


@register("DetectionEvaluate")
class DetectionEvaluateLayer(HeadLayer):
    """DetectionEvaluate (``detection_evaluate_param``): ``num_classes``, ``background_label_id``
    (0), ``overlap_threshold`` (0.5), ``evaluate_difficult_gt`` (true: a difficult box counts as
    any other; false: it is left out of the counts and a detection matching it is neither a true
    nor a false positive: tp = fp = 0). Boxes are compared normalised; ``name_size_file``
    (rescaling to the original image sizes) is refused."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.detection_evaluate_param
        if not p.HasField("num_classes") or p.num_classes < 1:
            self.fail("detection_evaluate_param needs num_classes")
        if p.name_size_file:
            self.fail("name_size_file (evaluating at the original image sizes) is not supported: "
                      "remove it to evaluate on the normalised boxes")
        self.num_classes = int(p.num_classes)
        self.background = int(p.background_label_id)
        self.overlap = F32(p.overlap_threshold)
        self.difficult = bool(p.evaluate_difficult_gt)

    def test_tally(self, ap_version: str = "Integral") -> Any:
        from amct_torch.quality.detection_map import DetectionMap
        return DetectionMap(ap_version)

    def _rows_of(self, x: torch.Tensor, width: int, what: str) -> list[list[float]]:
        if x.numel() % width:
            self.data_fail(f"the {what} blob holds {x.numel()} values: not rows of {width}")
        return x.detach().to("cpu", torch.float32).reshape(-1, width).tolist()

    def _ground_truth(self, rows: list[list[float]]) -> dict[int, dict[int, list[tuple[Box, bool]]]]:
        """item -> label -> [(box, difficult)], read up to the first row of item -1."""
        out: dict[int, dict[int, list[tuple[Box, bool]]]] = {}
        for r in rows:
            item = int(r[0])
            if item == -1:
                break
            label = int(r[1])
            if label == self.background:
                self.data_fail(f"a ground-truth box of item {item} has the background label {label}")
            box = (F32(r[3]), F32(r[4]), F32(r[5]), F32(r[6]))
            out.setdefault(item, {}).setdefault(label, []).append((box, bool(r[7])))
        return out

    def _detections(self, rows: list[list[float]]) -> dict[int, dict[int, list[tuple[float, Box]]]]:
        """item -> label -> [(score, box)] of the detection rows (item -1 rows skipped)."""
        out: dict[int, dict[int, list[tuple[float, Box]]]] = {}
        for r in rows:
            item = int(r[0])
            if item == -1:
                continue
            label = int(r[1])
            if label == self.background:
                self.data_fail(f"a detection of item {item} has the background label {label}")
            box = (F32(r[3]), F32(r[4]), F32(r[5]), F32(r[6]))
            out.setdefault(item, {}).setdefault(label, []).append((float(F32(r[2])), box))
        return out

    def evaluate(self, det_rows: list[list[float]], gt_rows: list[list[float]]) -> list[list[float]]:
        """The evaluation rows of one batch (see the module's docstring)."""
        gts = self._ground_truth(gt_rows)
        dets = self._detections(det_rows)
        num_pos: dict[int, int] = {}
        for labels in gts.values():
            for label, boxes in labels.items():
                count = len(boxes) if self.difficult else sum(1 for _, d in boxes if not d)
                num_pos[label] = num_pos.get(label, 0) + count
        out = [[-1.0, float(c), float(num_pos.get(c, 0)), -1.0, -1.0]
               for c in range(self.num_classes) if c != self.background]
        for item in sorted(dets):
            item_gt = gts.get(item, {})
            for label in sorted(dets[item]):
                if label == -1:
                    continue
                found = dets[item][label]
                truth = item_gt.get(label)
                if truth is None:
                    out += [[float(item), float(label), s, 0.0, 1.0] for s, _ in found]
                    continue
                taken = [False] * len(truth)
                for score, box in sorted(found, key=lambda d: -d[0]):
                    best, j_best = F32(-1.0), -1
                    for j, (g, _) in enumerate(truth):
                        o = jaccard(box, g)
                        if o > best:
                            best, j_best = o, j
                    tp, fp = 0.0, 1.0
                    if best >= self.overlap:
                        if self.difficult or not truth[j_best][1]:
                            tp, fp = (0.0, 1.0) if taken[j_best] else (1.0, 0.0)
                            taken[j_best] = True
                        else:
                            tp, fp = 0.0, 0.0
                    out.append([float(item), float(label), score, tp, fp])
        return out

    def forward(self, detections: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        rows = self.evaluate(self._rows_of(detections, 7, "detection"), self._rows_of(labels, 8, "label"))
        return torch.tensor(rows, dtype=torch.float32, device=detections.device).reshape(1, 1, -1, 5)
