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

from typing import Any, Optional

import numpy as np
import torch

from amct_torch.caffe.layers.base import register
from amct_torch.caffe.layers.metrics import HeadLayer
from amct_torch.errors import DataError
from amct_torch.proto import amct_caffe_pb2 as pb

F32 = np.float32
Box = tuple[np.float32, np.float32, np.float32, np.float32]
#: item -> label -> [(box, score or difficult flag)]
Grouped = dict[int, dict[int, list[tuple[Box, float]]]]


def box_size(b: Box, normalized: bool = True) -> np.float32:
    """The fork's BBoxSize: 0 for an inverted box; in pixels (not normalised) each side + 1."""
    if b[2] < b[0] or b[3] < b[1]:
        return F32(0.0)
    one = F32(0.0) if normalized else F32(1.0)
    return F32(F32(b[2] - b[0] + one) * F32(b[3] - b[1] + one))


def jaccard(a: Box, b: Box, normalized: bool = True) -> np.float32:
    """The fork's JaccardOverlap, in float32 (pixel boxes: each side + 1)."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F32(0.0)
    one = F32(0.0) if normalized else F32(1.0)
    w = F32(min(a[2], b[2]) - max(a[0], b[0]) + one)
    h = F32(min(a[3], b[3]) - max(a[1], b[1]) + one)
    if w <= 0 or h <= 0:
        return F32(0.0)
    inter = F32(w * h)
    return F32(inter / F32(box_size(a, normalized) + box_size(b, normalized) - inter))


def to_pixels(b: Box, size: tuple[int, int]) -> Box:
    """The fork's OutputBBox without a resize or with WARP: clipped to [0, 1], then scaled to
    the (height, width) image."""
    h, w = F32(size[0]), F32(size[1])
    x0, y0, x1, y1 = (F32(min(max(v, F32(0.0)), F32(1.0))) for v in b)
    return (F32(x0 * w), F32(y0 * h), F32(x1 * w), F32(y1 * h))


def read_name_sizes(path: str, layer: str) -> list[tuple[int, int]]:
    """(height, width) of each line "name height width" of a name_size_file, in DB order."""
    sizes = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                if len(parts) != 3:
                    raise ValueError
                h, w = int(parts[1]), int(parts[2])
                if h < 1 or w < 1:
                    raise ValueError
            except ValueError:
                raise DataError(f"line {n} is not 'name height width' with positive sizes: {line.strip()[:80]!r}",
                                file=path, layer=layer) from None
            sizes.append((h, w))
    if not sizes:
        raise DataError("the name_size_file lists no image", file=path, layer=layer)
    return sizes


@register("DetectionEvaluate")
class DetectionEvaluateLayer(HeadLayer):
    """DetectionEvaluate (``detection_evaluate_param``): ``num_classes``, ``background_label_id``
    (0), ``overlap_threshold`` (0.5), ``evaluate_difficult_gt`` (true: a difficult box counts as
    any other; false: it is left out of the counts and a detection matching it is neither a true
    nor a false positive: tp = fp = 0). Boxes are compared normalised; with ``name_size_file``
    (lines "name height width" in the database's order) in pixels of each original image, as
    the fork does: the image count advances by one per item with detection rows and wraps at
    the file's end (``resize_param`` WARP or none; the FIT modes are refused)."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.detection_evaluate_param
        if not p.HasField("num_classes") or p.num_classes < 1:
            self.fail("detection_evaluate_param needs num_classes")
        if p.name_size_file and p.HasField("resize_param") and \
                p.resize_param.resize_mode != pb.ResizeParameter.WARP:
            self.fail("resize_param: only resize_mode WARP is supported with name_size_file")
        self.num_classes = int(p.num_classes)
        self.background = int(p.background_label_id)
        self.overlap = F32(p.overlap_threshold)
        self.difficult = bool(p.evaluate_difficult_gt)
        self.name_size_file = str(p.name_size_file)
        self.sizes: Optional[list[tuple[int, int]]] = None
        self.count = 0

    def test_tally(self, ap_version: str = "Integral") -> Any:
        """A fresh DetectionMap; the original-size count starts again at the first image."""
        from amct_torch.quality.detection_map import DetectionMap
        self.count = 0
        return DetectionMap(ap_version)

    def _image_sizes(self) -> Optional[list[tuple[int, int]]]:
        if self.name_size_file and self.sizes is None:
            from amct_torch.inputs.caffe_data.paths import data_base_dir, resolve
            path = resolve(self.name_size_file, data_base_dir(self._file), "name_size_file",
                           layer=self.caffe_name, file=self._file)
            self.sizes = read_name_sizes(path, self.caffe_name)
        return self.sizes

    def _grouped(self, x: torch.Tensor, width: int, what: str) -> Grouped:
        """item -> label -> [(box, extra)] of a blob of rows: the label rows up to the first of
        item -1 (extra: difficult), or the detection rows but those of item -1 (extra: score)."""
        if x.numel() % width:
            self.data_fail(f"the {what} blob holds {x.numel()} values: not rows of {width}")
        out: Grouped = {}
        for r in x.detach().to("cpu", torch.float32).reshape(-1, width).tolist():
            item, label = int(r[0]), int(r[1])
            if item == -1:
                if width == 8:
                    break
                continue
            if label == self.background:
                self.data_fail(f"a {what} of item {item} has the background label {label}")
            box = (F32(r[3]), F32(r[4]), F32(r[5]), F32(r[6]))
            extra = float(r[7]) if width == 8 else float(F32(r[2]))
            out.setdefault(item, {}).setdefault(label, []).append((box, extra))
        return out

    def _match(self, item: int, label: int, found: list[tuple[Box, float]],
               truth: list[tuple[Box, float]], size: Optional[tuple[int, int]]) -> list[list[float]]:
        """The rows of one item's detections of one label against its boxes of that label."""
        if size is not None:
            truth = [(to_pixels(g, size), d) for g, d in truth]
        taken = [False] * len(truth)
        rows = []
        for box, score in sorted(found, key=lambda d: -d[1]):
            if size is not None:
                box = to_pixels(box, size)
            best, j_best = F32(-1.0), -1
            for j, (g, _) in enumerate(truth):
                o = jaccard(box, g, size is None)
                if o > best:
                    best, j_best = o, j
            tp, fp = 0.0, 1.0
            if best >= self.overlap:
                if self.difficult or not truth[j_best][1]:
                    tp, fp = (0.0, 1.0) if taken[j_best] else (1.0, 0.0)
                    taken[j_best] = True
                else:
                    tp, fp = 0.0, 0.0
            rows.append([float(item), float(label), score, tp, fp])
        return rows

    def evaluate(self, detections: torch.Tensor, labels: torch.Tensor) -> list[list[float]]:
        """The evaluation rows of one batch (see the module's docstring)."""
        gts = self._grouped(labels, 8, "ground-truth box")
        dets = self._grouped(detections, 7, "detection")
        sizes = self._image_sizes()
        num_pos: dict[int, int] = {}
        for per_label in gts.values():
            for label, boxes in per_label.items():
                count = len(boxes) if self.difficult else sum(1 for _, d in boxes if not d)
                num_pos[label] = num_pos.get(label, 0) + count
        out = [[-1.0, float(c), float(num_pos.get(c, 0)), -1.0, -1.0]
               for c in range(self.num_classes) if c != self.background]
        for item in sorted(dets):
            size = sizes[self.count] if sizes else None
            for label in sorted(dets[item]):
                if label == -1:
                    continue
                truth = gts.get(item, {}).get(label)
                if truth is None:
                    out += [[float(item), float(label), s, 0.0, 1.0] for _, s in dets[item][label]]
                else:
                    out += self._match(item, label, dets[item][label], truth, size)
            if sizes:
                self.count = (self.count + 1) % len(sizes)
        return out

    def forward(self, detections: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        rows = self.evaluate(detections, labels)
        return torch.tensor(rows, dtype=torch.float32, device=detections.device).reshape(1, 1, -1, 5)
