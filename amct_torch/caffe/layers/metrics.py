"""Caffe's metric and loss layers (Accuracy, SoftmaxWithLoss, SigmoidCrossEntropyLoss,
EuclideanLoss) with Caffe's test-phase arithmetic.

They are the net's head: they read the inference part's outputs and the data layers' labels,
so they are kept out of the inference graph (``net_head``), never quantized nor exported to
ONNX, and run after it (caffe/head.py). Labels are read as Caffe reads them, ``static_cast<int>``
of the float (truncation toward zero); a label out of range is a DataError naming the layer.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F

from amct_torch.caffe.layers.base import CaffeLayer, canonical_axis, register
from amct_torch.errors import DataError
from amct_torch.proto import amct_caffe_pb2 as pb

#: Caffe's FLT_MIN: the smallest probability whose log SoftmaxWithLoss takes
FLT_MIN = float(torch.finfo(torch.float32).tiny)


class HeadLayer(CaffeLayer):
    """A metric or loss layer: scalar tops, loss weights as Caffe gives them."""

    net_head = True
    keeps_outputs = True
    no_onnx_form = "a metric or loss layer runs after the inference part, in torch, never in the ONNX models"
    bottoms = (2, 2)
    #: Caffe's LossLayer gives the first top loss weight 1 when the layer names none
    default_loss_weight: ClassVar[float] = 0.0

    def loss_weights(self) -> list[float]:
        """The loss weight of each top (``loss_weight``, else the layer type's default for the
        first top and 0 for the others)."""
        given = list(self.layer_param.loss_weight)
        if not given:
            given = [self.default_loss_weight]
        return [float(given[k]) if k < len(given) else 0.0 for k in range(self.num_tops)]

    def test_tally(self, ap_version: str = "Integral") -> Optional[Any]:
        """What ``amct-torch test`` reports of the first top when it is not the mean of a scalar
        over the iterations: an object with ``add(top)``, ``value()`` and ``label`` (the
        DetectionEvaluate rows' mAP); None: the mean."""
        return None

    def data_fail(self, message: str) -> None:
        raise DataError(message, layer=self.caffe_name)

    def labels_of(self, labels: torch.Tensor, count: int) -> torch.Tensor:
        """The labels as integers (Caffe's static_cast<int>), checked to number ``count``."""
        if labels.numel() != count:
            self.data_fail(f"{labels.numel()} label(s) for {count} prediction(s); the label count "
                           "must be the predictions' outer x inner count")
        return labels.reshape(-1).to(torch.int64)


    def class_labels(self, scores: torch.Tensor, labels: torch.Tensor, axis: int, ignore: Optional[int]):
        """(axis, outer, classes, inner, labels (outer, inner), not-ignored mask) of class
        scores along ``axis``; a label not ignored outside [0, classes) is a DataError."""
        ax = canonical_axis(axis, scores.dim(), self)
        classes = int(scores.shape[ax])
        outer = math.prod(scores.shape[:ax])
        inner = scores.numel() // max(outer * classes, 1)
        lab = self.labels_of(labels, outer * inner).reshape(outer, inner)
        valid = torch.ones_like(lab, dtype=torch.bool) if ignore is None else lab != ignore
        bad = valid & ((lab < 0) | (lab >= classes))
        if bool(bad.any()):
            value = int(lab[bad][0])
            self.data_fail(f"label {value} is out of range for {classes} classes (0..{classes - 1})")
        return ax, outer, classes, inner, lab, valid


def _normalization(p: pb.LossParameter, default: int) -> int:
    """Caffe's rule: ``normalization`` when given; else the legacy ``normalize`` (true: VALID,
    false: BATCH_SIZE); else the layer's default."""
    if p.HasField("normalization"):
        return int(p.normalization)
    if p.HasField("normalize"):
        return pb.LossParameter.VALID if p.normalize else pb.LossParameter.BATCH_SIZE
    return default


def normalizer(mode: int, outer: int, inner: int, valid: torch.Tensor) -> torch.Tensor:
    """Caffe's get_normalizer, at least 1 (``valid``: the count of labels not ignored)."""
    if mode == pb.LossParameter.FULL:
        n = torch.tensor(float(outer * inner))
    elif mode == pb.LossParameter.VALID:
        n = valid.to(torch.float32)
    elif mode == pb.LossParameter.BATCH_SIZE:
        n = torch.tensor(float(outer))
    else:
        n = torch.tensor(1.0)
    return torch.clamp(n.to(valid.device, torch.float32), min=1.0)


@register("Accuracy")
class AccuracyLayer(HeadLayer):
    """Top-k accuracy along ``axis``: a sample is right when fewer than ``top_k`` scores are
    >= the true class's score, the true class itself left out (Caffe's tie rule: a tie counts
    against); labels equal to ``ignore_label`` are skipped; 0 when none is counted. A second
    top gives the per-class accuracy."""

    tops = (1, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.accuracy_param
        self.top_k, self.axis = int(p.top_k), int(p.axis)
        self.ignore: Optional[int] = int(p.ignore_label) if p.HasField("ignore_label") else None

    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        if self.top_k > scores.numel() // max(labels.numel(), 1):
            self.data_fail(f"top_k {self.top_k} exceeds the number of classes")
        ax, outer, classes, inner, lab, valid = self.class_labels(scores, labels, self.axis, self.ignore)
        x = scores.reshape(outer, classes, inner)
        true = x.gather(1, lab.clamp(0, classes - 1).unsqueeze(1))
        better = (x >= true).sum(dim=1) - 1  # the true class counts itself once
        right = (better < self.top_k) & valid
        count = valid.sum()
        acc = torch.where(count > 0, right.sum().to(torch.float32) / count.clamp(min=1).to(torch.float32),
                          torch.zeros((), device=scores.device))
        if self.num_tops == 1:
            return acc
        per_n = torch.zeros(classes, device=scores.device).index_add_(
            0, lab[valid], torch.ones_like(lab[valid], dtype=torch.float32))
        per_r = torch.zeros(classes, device=scores.device).index_add_(
            0, lab[right], torch.ones_like(lab[right], dtype=torch.float32))
        per_class = torch.where(per_n > 0, per_r / per_n.clamp(min=1), torch.zeros_like(per_n))
        return acc, per_class


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(HeadLayer):
    """Mean negative log softmax probability of the true class (at least FLT_MIN), over the
    labels not ignored, divided by the normalization's count (default VALID); a second top is
    the softmax itself."""

    tops = (1, 2)
    default_loss_weight = 1.0

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.loss_param
        self.axis = int(self.layer_param.softmax_param.axis)
        self.ignore: Optional[int] = int(p.ignore_label) if p.HasField("ignore_label") else None
        self.mode = _normalization(p, pb.LossParameter.VALID)

    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        ax, outer, classes, inner, lab, valid = self.class_labels(scores, labels, self.axis, self.ignore)
        prob = F.softmax(scores, dim=ax)
        p_true = prob.reshape(outer, classes, inner).gather(1, lab.clamp(0, classes - 1).unsqueeze(1)).squeeze(1)
        nll = -torch.log(torch.clamp(p_true, min=FLT_MIN))
        loss = torch.where(valid, nll, torch.zeros_like(nll)).sum()
        loss = loss / normalizer(self.mode, outer, inner, valid.sum())
        return loss if self.num_tops == 1 else (loss, prob)


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(HeadLayer):
    """Cross entropy of sigmoid(x) against targets in [0, 1], in Caffe's stable form, over the
    targets not ignored, divided by the normalization's count (default BATCH_SIZE)."""

    default_loss_weight = 1.0

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.loss_param
        self.ignore: Optional[int] = int(p.ignore_label) if p.HasField("ignore_label") else None
        self.mode = _normalization(p, pb.LossParameter.BATCH_SIZE)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if x.numel() != target.numel():
            self.data_fail(f"{target.numel()} target(s) for {x.numel()} input(s): the counts must agree")
        t = target.reshape(x.shape).to(x.dtype)
        pos = (x >= 0).to(x.dtype)
        term = x * (t - pos) - torch.log(1 + torch.exp(x - 2 * x * pos))
        valid = torch.ones_like(t, dtype=torch.bool) if self.ignore is None else t.to(torch.int64) != self.ignore
        loss = -torch.where(valid, term, torch.zeros_like(term)).sum()
        outer = int(x.shape[0]) if x.dim() else 1
        return loss / normalizer(self.mode, outer, x.numel() // max(outer, 1), valid.sum())


@register("EuclideanLoss")
class EuclideanLossLayer(HeadLayer):
    """Sum of squared differences / (2 N), N the first axis of the first bottom."""

    default_loss_weight = 1.0

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.numel() != b.numel():
            self.data_fail(f"the bottoms hold {a.numel()} and {b.numel()} values: they must agree")
        d = a.reshape(-1) - b.reshape(-1).to(a.dtype)
        n = int(a.shape[0]) if a.dim() else 1
        return torch.dot(d, d) / n / 2
