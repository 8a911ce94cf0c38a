"""The SSD fork's detection layers: PriorBox (anchor boxes) and DetectionOutput (decode +
per-class NMS), following weiliu89/caffe's test-time behaviour."""
from __future__ import annotations

import math

import numpy as np
import torch

from amct_torch.caffe.layers.base import CaffeLayer, register

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


@register("PriorBox")
class PriorBoxLayer(CaffeLayer):
    """Output (1, 2, H*W*num_priors*4): normalised corner boxes, then their variances.

    Per cell, per min_size: the min_size square, the sqrt(min*max) square (if max sizes are
    given), then one box per aspect ratio other than 1 (with 1/ar added when ``flip``)."""

    bottoms = (2, 2)

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.prior_box_param
        self.min_sizes = [float(v) for v in p.min_size]
        self.max_sizes = [float(v) for v in p.max_size]
        if not self.min_sizes or any(v <= 0 for v in self.min_sizes):
            self.fail("PriorBox needs positive min_size values")
        if self.max_sizes and len(self.max_sizes) != len(self.min_sizes):
            self.fail("PriorBox needs as many max_size as min_size values")
        if any(mx <= mn for mn, mx in zip(self.min_sizes, self.max_sizes)):
            self.fail("max_size must be greater than min_size")
        ars = [1.0]
        for ar in p.aspect_ratio:
            if any(abs(ar - a) < 1e-6 for a in ars):
                continue
            ars.append(float(ar))
            if p.flip:
                ars.append(1.0 / float(ar))
        self.aspect_ratios = ars
        self.clip = bool(p.clip)
        var = [float(v) for v in p.variance]
        if len(var) not in (0, 1, 4):
            self.fail("PriorBox variance must have 1 or 4 values")
        self.variance = [0.1] * 4 if not var else (var * 4 if len(var) == 1 else var)
        if p.HasField("img_size") and (p.HasField("img_h") or p.HasField("img_w")):
            self.fail("give img_size or img_h/img_w, not both")
        self.img_h = int(p.img_size or p.img_h)
        self.img_w = int(p.img_size or p.img_w)
        if p.HasField("step") and (p.HasField("step_h") or p.HasField("step_w")):
            self.fail("give step or step_h/step_w, not both")
        self.step_h = float(p.step or p.step_h)
        self.step_w = float(p.step or p.step_w)
        self.offset = float(p.offset)

    @property
    def num_priors(self) -> int:
        return len(self.aspect_ratios) * len(self.min_sizes) + len(self.max_sizes)

    def _sizes(self) -> list[tuple[float, float]]:
        """(box width, box height) of each prior at one cell, in Caffe's order."""
        out = []
        for i, mn in enumerate(self.min_sizes):
            out.append((mn, mn))
            if self.max_sizes:
                s = math.sqrt(mn * self.max_sizes[i])
                out.append((s, s))
            for ar in self.aspect_ratios:
                if abs(ar - 1.0) < 1e-6:
                    continue
                out.append((mn * math.sqrt(ar), mn / math.sqrt(ar)))
        return out

    def forward(self, feat: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        lh, lw = feat.shape[-2], feat.shape[-1]
        ih = self.img_h or image.shape[-2]
        iw = self.img_w or image.shape[-1]
        sh = self.step_h or ih / lh
        sw = self.step_w or iw / lw
        dev = feat.device
        cy = (torch.arange(lh, device=dev, dtype=torch.float32) + self.offset) * sh
        cx = (torch.arange(lw, device=dev, dtype=torch.float32) + self.offset) * sw
        cy, cx = cy.view(lh, 1, 1).expand(lh, lw, 1), cx.view(1, lw, 1).expand(lh, lw, 1)
        wh = torch.tensor(self._sizes(), device=dev, dtype=torch.float32)  # (P, 2)
        bw, bh = wh[:, 0].view(1, 1, -1) / 2, wh[:, 1].view(1, 1, -1) / 2
        boxes = torch.stack([(cx - bw) / iw, (cy - bh) / ih, (cx + bw) / iw, (cy + bh) / ih], dim=-1)
        boxes = boxes.reshape(-1)
        if self.clip:
            boxes = boxes.clamp(0.0, 1.0)
        var = torch.tensor(self.variance, device=dev, dtype=torch.float32).repeat(boxes.numel() // 4)
        return torch.stack([boxes, var]).unsqueeze(0).to(feat.dtype)


def _decode(loc: torch.Tensor, prior: torch.Tensor, var: torch.Tensor, code: int,
            encoded: bool) -> torch.Tensor:
    """Decode (P, 4) location offsets against (P, 4) priors with (P, 4) variances."""
    v = torch.ones_like(var) if encoded else var
    if code == CORNER:
        return prior + loc * v
    pw = prior[:, 2] - prior[:, 0]
    ph = prior[:, 3] - prior[:, 1]
    if code == CORNER_SIZE:
        return prior + loc * v * torch.stack([pw, ph, pw, ph], dim=1)
    pcx = (prior[:, 0] + prior[:, 2]) / 2
    pcy = (prior[:, 1] + prior[:, 3]) / 2
    cx = v[:, 0] * loc[:, 0] * pw + pcx
    cy = v[:, 1] * loc[:, 1] * ph + pcy
    w = torch.exp(v[:, 2] * loc[:, 2]) * pw
    h = torch.exp(v[:, 3] * loc[:, 3]) * ph
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1)


def _iou(box: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Jaccard overlap of one normalised box with many (no +1 on widths)."""
    ix1 = torch.maximum(box[0], boxes[:, 0])
    iy1 = torch.maximum(box[1], boxes[:, 1])
    ix2 = torch.minimum(box[2], boxes[:, 2])
    iy2 = torch.minimum(box[3], boxes[:, 3])
    iw, ih = (ix2 - ix1).clamp(min=0), (iy2 - iy1).clamp(min=0)
    inter = iw * ih

    def area(b):
        return ((b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0))
    union = area(box) + area(boxes) - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, torch.ones_like(union)),
                       torch.zeros_like(union))


def _nms(boxes: torch.Tensor, scores: torch.Tensor, score_thr: float, nms_thr: float, eta: float,
         top_k: int) -> list[int]:
    """SSD's ApplyNMSFast: greedy NMS over scores > threshold, best first (stable order)."""
    idx = torch.nonzero(scores > score_thr).flatten()
    if idx.numel() == 0:
        return []
    order = idx[torch.sort(scores[idx], descending=True, stable=True).indices]
    if top_k > -1:
        order = order[:top_k]
    keep: list[int] = []
    adaptive = nms_thr
    for i in order.tolist():
        if keep and bool((_iou(boxes[i], boxes[keep]) > adaptive).any()):
            continue
        keep.append(i)
        if eta < 1 and adaptive > 0.5:
            adaptive *= eta
    return keep


@register("DetectionOutput")
class DetectionOutputLayer(CaffeLayer):
    """Decode boxes, per-class NMS, keep_top_k over classes. Output (1, 1, D, 7) rows
    [image_id, label, score, xmin, ymin, xmax, ymax], grouped per image by ascending label,
    best score first; when the whole batch has no detection, one row of -1 per image (with its
    image_id)."""

    bottoms = (3, 3)
    data_dependent = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.detection_output_param
        if p.num_classes < 1:
            self.fail("num_classes is required")
        self.num_classes = int(p.num_classes)
        self.share_location = bool(p.share_location)
        self.background = int(p.background_label_id)
        self.nms_threshold = float(p.nms_param.nms_threshold)
        self.nms_top_k = int(p.nms_param.top_k) if p.nms_param.HasField("top_k") else -1
        self.eta = float(p.nms_param.eta)
        self.code_type = int(p.code_type)
        self.encoded = bool(p.variance_encoded_in_target)
        self.keep_top_k = int(p.keep_top_k)
        self.confidence_threshold = float(p.confidence_threshold) if p.HasField("confidence_threshold") \
            else -float("inf")

    def infer_shapes(self, bottom_shapes):
        """The heads must agree with the priors, as Caffe's DetectionOutput checks at reshape:
        per image, loc holds num_priors × (1 or num_classes) × 4 values and conf num_priors ×
        num_classes, where num_priors is the prior blob's (1, 2, num_priors × 4) last axis / 4.
        Found here, a head whose num_output does not match its PriorBox is a model error at
        load instead of a reshape failure on the user's data. The output size depends on the
        detections: None."""
        loc, conf, prior = bottom_shapes
        if len(prior) != 3 or prior[1] != 2 or prior[2] % 4:
            self.fail(f"the prior blob has shape {list(prior)}, expected (1, 2, num_priors x 4) "
                      "from PriorBox (or a Concat of them on axis 2)")
        priors = prior[2] // 4
        n_loc = 1 if self.share_location else self.num_classes
        per = [int(np.prod(s[1:], dtype=np.int64)) for s in (loc, conf)]
        if loc[0] != conf[0]:
            self.fail(f"loc has {loc[0]} images but conf has {conf[0]}")
        for what, got, want, how in (("loc", per[0], priors * n_loc * 4, f"x {n_loc} x 4"),
                                     ("conf", per[1], priors * self.num_classes,
                                      f"x {self.num_classes} classes")):
            if got != want:
                self.fail(f"{what} has {got} values per image but the priors need {want} "
                          f"({priors} priors {how}): the {what} heads' num_output do not match "
                          "their PriorBox layers")
        return None

    def forward(self, loc: torch.Tensor, conf: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        n = loc.shape[0]
        num_priors = prior.shape[-1] // 4
        n_loc = 1 if self.share_location else self.num_classes
        loc = loc.reshape(n, num_priors, n_loc, 4).float()
        conf = conf.reshape(n, num_priors, self.num_classes).float()
        pri = prior.reshape(prior.shape[0], -1, num_priors * 4)
        boxes_p, var_p = pri[0, 0].reshape(-1, 4).float(), pri[0, 1].reshape(-1, 4).float()
        rows: list[list[float]] = []
        for i in range(n):
            dets: list[tuple[int, float, int, int]] = []  # (label, score, loc class slot, prior index)
            decoded = [_decode(loc[i, :, c], boxes_p, var_p, self.code_type, self.encoded) for c in range(n_loc)]
            for c in range(self.num_classes):
                if c == self.background:
                    continue
                slot = 0 if self.share_location else c
                keep = _nms(decoded[slot], conf[i, :, c], self.confidence_threshold,
                            self.nms_threshold, self.eta, self.nms_top_k)
                dets.extend((c, float(conf[i, k, c]), slot, k) for k in keep)
            if self.keep_top_k > -1 and len(dets) > self.keep_top_k:
                best = sorted(range(len(dets)), key=lambda j: -dets[j][1])[: self.keep_top_k]
                dets = [dets[j] for j in best]
                dets.sort(key=lambda d: (d[0], -d[1]))
            for c, s, slot, k in dets:
                b = decoded[slot][k].tolist()
                rows.append([float(i), float(c), s] + b)
        if not rows:  # SSD: no detection in the whole batch -> one row of -1 per image
            rows = [[float(i)] + [-1.0] * 6 for i in range(n)]
        return torch.tensor(rows, dtype=loc.dtype, device=loc.device).view(1, 1, -1, 7)
