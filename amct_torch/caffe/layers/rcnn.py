"""The two-stage detectors' layers: ``ROIPooling`` (py-faster-rcnn), ``PSROIPooling`` (R-FCN),
``Proposal`` (Faster R-CNN's region proposals as OpenCV's Caffe importer runs them) and the
``Python`` layer, of which only py-faster-rcnn's ``rpn.proposal_layer.ProposalLayer`` is known.

Why data-dependent: the number of proposals depends on the scores (NMS), so these layers are
``data_dependent`` (the graph builder does not push meta shapes through them) and the ROI
layers take the box list as it comes: one row per ROI ``[batch index, x1, y1, x2, y2]`` in
input-image pixels.

Rounding follows the C code: ``round`` is half away from zero (``torch.round`` is half to even).
"""
from __future__ import annotations

import ast
import math
from typing import ClassVar

import torch

from amct_torch.caffe.layers.base import CaffeLayer, register


def c_round(x: torch.Tensor) -> torch.Tensor:
    """C's ``round``: half away from zero."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _rois(layer: CaffeLayer, rois: torch.Tensor) -> torch.Tensor:
    """The ROI blob as (R, 5) float32 rows; Caffe accepts (R, 5) and (R, 5, 1, 1)."""
    if rois.numel() % 5 or (rois.dim() >= 2 and rois.shape[1] != 5):
        layer.fail(f"{layer.caffe_type} takes ROIs as rows of 5 values [batch, x1, y1, x2, y2], got "
                   f"shape {list(rois.shape)}")
    return rois.reshape(-1, 5).float()


def _batch_index(layer: CaffeLayer, rois: torch.Tensor, n: int) -> list[int]:
    idx = rois[:, 0].long().tolist()
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        layer.fail(f"{layer.caffe_type}: ROI batch index {bad[0]} is outside the batch of {n}")
    return idx


@register("ROIPooling")
class ROIPoolingLayer(CaffeLayer):
    """py-faster-rcnn's max ROI pooling: ROI corners round(x·spatial_scale), size
    max(end − start + 1, 1), bin [floor(p·size/P), ceil((p+1)·size/P)) shifted by the start and
    clipped to the map; an empty bin gives 0. Output (R, C, pooled_h, pooled_w)."""

    bottoms = (2, 2)
    data_dependent = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.roi_pooling_param
        self.pooled_h, self.pooled_w = int(p.pooled_h), int(p.pooled_w)
        self.spatial_scale = float(p.spatial_scale)
        if self.pooled_h < 1 or self.pooled_w < 1:
            self.fail(f"ROIPooling needs pooled_h and pooled_w >= 1, got {self.pooled_h}x{self.pooled_w}")
        if not (self.spatial_scale > 0 and math.isfinite(self.spatial_scale)):
            self.fail(f"ROIPooling spatial_scale must be positive, got {self.spatial_scale}")

    def bins(self, rois: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, ...]:
        """Per ROI and bin: hstart, hend (R, P) and wstart, wend (R, Q), clipped."""
        scale = torch.tensor(self.spatial_scale, dtype=torch.float32, device=rois.device)
        x1, y1, x2, y2 = (c_round(rois[:, k] * scale) for k in (1, 2, 3, 4))
        rh = torch.clamp(y2 - y1 + 1, min=1)
        rw = torch.clamp(x2 - x1 + 1, min=1)
        bh = rh / self.pooled_h
        bw = rw / self.pooled_w
        ph = torch.arange(self.pooled_h, device=rois.device, dtype=torch.float32)
        pw = torch.arange(self.pooled_w, device=rois.device, dtype=torch.float32)
        hs = torch.floor(ph[None] * bh[:, None]) + y1[:, None]
        he = torch.ceil((ph[None] + 1) * bh[:, None]) + y1[:, None]
        ws = torch.floor(pw[None] * bw[:, None]) + x1[:, None]
        we = torch.ceil((pw[None] + 1) * bw[:, None]) + x1[:, None]
        return hs.clamp(0, h), he.clamp(0, h), ws.clamp(0, w), we.clamp(0, w)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        r = _rois(self, rois).to(x.device)
        n, c, h, w = x.shape
        out = x.new_zeros((r.shape[0], c, self.pooled_h, self.pooled_w))
        if r.shape[0] == 0:
            return out
        batch = _batch_index(self, r, n)
        hs, he, ws, we = (t.long() for t in self.bins(r, h, w))
        hs_l, he_l, ws_l, we_l = hs.tolist(), he.tolist(), ws.tolist(), we.tolist()
        ar_h = torch.arange(h, device=x.device)
        ar_w = torch.arange(w, device=x.device)
        neg = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
        for i, b in enumerate(batch):
            y0, y1_ = min(hs_l[i]), max(he_l[i])
            x0, x1_ = min(ws_l[i]), max(we_l[i])
            if y1_ <= y0 or x1_ <= x0:
                continue
            crop = x[b, :, y0:y1_, x0:x1_]                                   # (C, h', w')
            mh = (ar_h[y0:y1_][None] >= hs[i][:, None]) & (ar_h[y0:y1_][None] < he[i][:, None])  # (P, h')
            mw = (ar_w[x0:x1_][None] >= ws[i][:, None]) & (ar_w[x0:x1_][None] < we[i][:, None])  # (Q, w')
            t = torch.where(mh[None, :, :, None], crop[:, None], neg).amax(dim=2)     # (C, P, w')
            t = torch.where(mw[None, None], t[:, :, None, :], neg).amax(dim=3)        # (C, P, Q)
            empty = ~(mh.any(1)[:, None] & mw.any(1)[None])                           # (P, Q)
            out[i] = torch.where(empty[None], torch.zeros_like(t), t)
        return out


@register("PSROIPooling")
class PSROIPoolingLayer(CaffeLayer):
    """R-FCN's position-sensitive average ROI pooling: ROI corners round(x)·spatial_scale (the
    end + 1), size max(end − start, 0.1), bin [floor(p·size/G + start), ceil((p+1)·size/G +
    start)) clipped to the map; bin (p, q) of output channel c averages input channel
    (c·G + p)·G + q; an empty bin gives 0. Output (R, output_dim, G, G)."""

    bottoms = (2, 2)
    data_dependent = True

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.psroi_pooling_param
        for f in ("spatial_scale", "output_dim", "group_size"):
            if not p.HasField(f):
                self.fail(f"PSROIPooling needs psroi_pooling_param {{ {f} }}")
        self.spatial_scale = float(p.spatial_scale)
        self.output_dim, self.group_size = int(p.output_dim), int(p.group_size)
        if not (self.spatial_scale > 0 and math.isfinite(self.spatial_scale)):
            self.fail(f"PSROIPooling spatial_scale must be positive, got {self.spatial_scale}")
        if self.output_dim < 1 or self.group_size < 1:
            self.fail(f"PSROIPooling output_dim and group_size must be >= 1, got "
                      f"{self.output_dim} and {self.group_size}")
        if bottom_shapes is not None:
            self.check_channels(bottom_shapes[0][1])

    def check_channels(self, c: int) -> None:
        g = self.group_size
        if c != self.output_dim * g * g:
            self.fail(f"PSROIPooling needs output_dim x group_size^2 = {self.output_dim * g * g} input "
                      f"channels, got {c}")

    def bins(self, rois: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, ...]:
        """Per ROI and bin: hstart, hend (R, G) and wstart, wend (R, G), clipped."""
        scale = torch.tensor(self.spatial_scale, dtype=torch.float32, device=rois.device)
        x1 = c_round(rois[:, 1]) * scale
        y1 = c_round(rois[:, 2]) * scale
        x2 = (c_round(rois[:, 3]) + 1) * scale
        y2 = (c_round(rois[:, 4]) + 1) * scale
        g = self.group_size
        bh = torch.clamp(y2 - y1, min=0.1) / g
        bw = torch.clamp(x2 - x1, min=0.1) / g
        p = torch.arange(g, device=rois.device, dtype=torch.float32)
        hs = torch.floor(p[None] * bh[:, None] + y1[:, None])
        he = torch.ceil((p[None] + 1) * bh[:, None] + y1[:, None])
        ws = torch.floor(p[None] * bw[:, None] + x1[:, None])
        we = torch.ceil((p[None] + 1) * bw[:, None] + x1[:, None])
        return hs.clamp(0, h), he.clamp(0, h), ws.clamp(0, w), we.clamp(0, w)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        r = _rois(self, rois).to(x.device)
        n, c, h, w = x.shape
        self.check_channels(c)
        g, d = self.group_size, self.output_dim
        out = x.new_zeros((r.shape[0], d, g, g))
        if r.shape[0] == 0:
            return out
        batch = _batch_index(self, r, n)
        hs, he, ws, we = self.bins(r, h, w)
        ar_h = torch.arange(h, device=x.device, dtype=torch.float32)
        ar_w = torch.arange(w, device=x.device, dtype=torch.float32)
        mh = ((ar_h[None, None] >= hs[:, :, None]) & (ar_h[None, None] < he[:, :, None])).to(x.dtype)  # (R, G, H)
        mw = ((ar_w[None, None] >= ws[:, :, None]) & (ar_w[None, None] < we[:, :, None])).to(x.dtype)  # (R, G, W)
        area = (he - hs)[:, :, None] * (we - ws)[:, None, :]                                          # (R, G, G)
        xs = x.reshape(n, d, g, g, h, w)
        for i, b in enumerate(batch):
            s = torch.einsum("cpqhw,ph,qw->cpq", xs[b], mh[i], mw[i])
            a = area[i].to(x.dtype)
            out[i] = torch.where(a > 0, s / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(s))
        return out


def _anchor_sizes(base: int, ratios: list[float], scales: list[float]) -> list[tuple[float, float]]:
    """(width, height) per anchor, ratio-major: w = floor(base/sqrt(r) + 0.5), h = floor(w·r + 0.5),
    both times the scale (OpenCV's ProposalLayer; py-faster-rcnn's generate_anchors)."""
    out: list[tuple[float, float]] = []
    for r in ratios:
        wd = math.floor(base / math.sqrt(r) + 0.5)
        ht = math.floor(wd * r + 0.5)
        out.extend((s * wd, s * ht) for s in scales)
    return out


class ProposalBase(CaffeLayer):
    """Faster R-CNN proposals as OpenCV's Caffe importer computes them (its ProposalLayer: a
    PriorBox of the anchors, then DetectionOutput with CENTER_SIZE decoding in pixels).

    Inputs: scores (N, 2A, H, W) (the second half of the channels are the object scores),
    deltas (N, 4A, H, W), im_info (N, >= 2) = [image height, image width, ...]. Per image:
    anchors centred at (x·feat_stride + base_size/2, y·feat_stride + base_size/2) with corners
    c ± size/2 (the far corner − 1); boxes decoded with width x2 − x1 + 1; clipped to
    [0, int(width) − 1] × [0, int(height) − 1]; the ``pre_nms_topn`` best scores (stable order)
    go through greedy NMS (IoU with +1 sizes, kept when IoU <= nms_thresh) and the first
    ``post_nms_topn`` survive. Output (R, 5) rows [image index, x1, y1, x2, y2], image after image
    (OpenCV runs batch 1 only); a second top gets the (R, 1) scores.

    Not applied, as in OpenCV: py-faster-rcnn's ``min_size`` filter (boxes smaller than
    min_size × im_info[2] are dropped before the top-n)."""

    bottoms: ClassVar[tuple[int, int | None]] = (3, 3)  # as CaffeLayer's: PythonLayer takes any count
    tops: ClassVar[tuple[int, int | None]] = (1, 2)
    data_dependent = True

    def configure(self, feat_stride: int, base_size: int, ratios: list[float], scales: list[float],
                  pre_nms: int, post_nms: int, nms_thresh: float, min_size: int) -> None:
        if feat_stride < 1 or base_size < 1:
            self.fail(f"{self.caffe_type} feat_stride and base_size must be >= 1, got {feat_stride} and {base_size}")
        if not ratios or not scales or any(not (v > 0) for v in ratios + scales):
            self.fail(f"{self.caffe_type} needs positive ratio and scale values, got {ratios} and {scales}")
        if pre_nms < 1 or post_nms < 1:
            self.fail(f"{self.caffe_type} pre_nms_topn and post_nms_topn must be >= 1")
        if not 0 <= nms_thresh <= 1:
            self.fail(f"{self.caffe_type} nms_thresh must be within [0, 1], got {nms_thresh}")
        self.feat_stride, self.base_size = int(feat_stride), int(base_size)
        self.ratios, self.scales = [float(r) for r in ratios], [float(s) for s in scales]
        self.pre_nms, self.post_nms, self.nms_thresh = int(pre_nms), int(post_nms), float(nms_thresh)
        self.min_size = int(min_size)
        self.sizes = _anchor_sizes(self.base_size, self.ratios, self.scales)

    @property
    def num_anchors(self) -> int:
        return len(self.sizes)

    def infer_shapes(self, bottom_shapes):
        a = self.num_anchors
        s, d = bottom_shapes[0], bottom_shapes[1]
        if len(s) != 4 or len(d) != 4 or s[1] != 2 * a or d[1] != 4 * a or s[2:] != d[2:] or s[0] != d[0]:
            self.fail(f"{self.caffe_type} with {a} anchors takes scores (N, {2 * a}, H, W) and deltas "
                      f"(N, {4 * a}, H, W), got {list(s)} and {list(d)}")
        return None

    def anchors(self, h: int, w: int, device) -> torch.Tensor:
        """(H·W·A, 4) anchors, cell-major then anchor, in pixels."""
        f32 = torch.float32
        wh = torch.tensor(self.sizes, dtype=f32, device=device)                        # (A, 2)
        off = torch.tensor(0.5 * self.base_size / self.feat_stride, dtype=f32, device=device)
        step = torch.tensor(float(self.feat_stride), dtype=f32, device=device)
        cy = (torch.arange(h, device=device, dtype=f32) + off) * step
        cx = (torch.arange(w, device=device, dtype=f32) + off) * step
        cy, cx = cy.view(h, 1, 1).expand(h, w, 1), cx.view(1, w, 1).expand(h, w, 1)
        hw, hh = wh[:, 0] * 0.5, wh[:, 1] * 0.5
        box = torch.stack([cx - hw, cy - hh, cx + hw - 1, cy + hh - 1], dim=-1)           # (H, W, A, 4)
        return box.reshape(-1, 4)

    def decode(self, deltas: torch.Tensor, anchors: torch.Tensor, im_h: float, im_w: float) -> torch.Tensor:
        pw = anchors[:, 2] - anchors[:, 0] + 1
        ph = anchors[:, 3] - anchors[:, 1] + 1
        pcx = anchors[:, 0] + pw * 0.5
        pcy = anchors[:, 1] + ph * 0.5
        cx = deltas[:, 0] * pw + pcx
        cy = deltas[:, 1] * ph + pcy
        bw = torch.exp(deltas[:, 2]) * pw
        bh = torch.exp(deltas[:, 3]) * ph
        box = torch.stack([cx - bw * 0.5, cy - bh * 0.5, cx + bw * 0.5, cy + bh * 0.5], dim=1)
        hi = torch.tensor([im_w - 1, im_h - 1, im_w - 1, im_h - 1], dtype=box.dtype, device=box.device)
        return torch.maximum(torch.minimum(box, hi), torch.zeros_like(box))

    def nms(self, boxes: torch.Tensor, scores: torch.Tensor) -> list[int]:
        order = torch.sort(scores, descending=True, stable=True).indices[: self.pre_nms]
        b = boxes[order]
        area = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
        keep: list[int] = []
        for k in range(b.shape[0]):
            if keep:
                kk = torch.tensor(keep, device=b.device)
                iw = torch.minimum(b[k, 2], b[kk, 2]) - torch.maximum(b[k, 0], b[kk, 0])
                ih = torch.minimum(b[k, 3], b[kk, 3]) - torch.maximum(b[k, 1], b[kk, 1])
                inter = torch.where((iw < 0) | (ih < 0), torch.zeros_like(iw), (iw + 1) * (ih + 1))
                iou = torch.where(inter > 0, inter / (area[k] + area[kk] - inter), torch.zeros_like(inter))
                if bool((iou > self.nms_thresh).any()):
                    continue
            keep.append(k)
            if len(keep) == self.post_nms:
                break
        return order[keep].tolist() if keep else []

    def forward(self, scores: torch.Tensor, deltas: torch.Tensor, im_info: torch.Tensor):
        n, c2a, h, w = scores.shape
        a = c2a // 2
        if c2a != 2 * self.num_anchors or deltas.shape[1] != 4 * self.num_anchors:
            self.infer_shapes([tuple(scores.shape), tuple(deltas.shape)])
        info = im_info.reshape(im_info.shape[0], -1).float()
        if info.shape[0] != n or info.shape[1] < 2:
            self.fail(f"{self.caffe_type} needs im_info (N, >= 2) for {n} image(s), got {list(im_info.shape)}")
        anchors = self.anchors(h, w, scores.device)
        obj = scores[:, a:].float().permute(0, 2, 3, 1).reshape(n, -1)
        dlt = deltas.float().permute(0, 2, 3, 1).reshape(n, -1, 4)
        rows, kept_scores = [], []
        for i in range(n):
            im_h, im_w = (float(math.trunc(v)) for v in info[i, :2].tolist())
            boxes = self.decode(dlt[i], anchors, im_h, im_w)
            keep = self.nms(boxes, obj[i])
            idx = torch.tensor(keep, dtype=torch.long, device=scores.device)
            bi = torch.full((len(keep), 1), float(i), device=scores.device)
            rows.append(torch.cat([bi, boxes[idx]], dim=1))
            kept_scores.append(obj[i][idx].reshape(-1, 1))
        out = torch.cat(rows).to(scores.dtype)
        if self.num_tops == 2:
            return out, torch.cat(kept_scores).to(scores.dtype)
        return out


@register("Proposal")
class ProposalLayer(ProposalBase):
    """``type: "Proposal"`` with ``proposal_param`` (OpenCV's caffe.proto); ratio and scale
    default to py-faster-rcnn's (0.5, 1, 2) and (8, 16, 32) when not given."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.proposal_param
        self.configure(p.feat_stride, p.base_size, list(p.ratio) or [0.5, 1.0, 2.0],
                       list(p.scale) or [8.0, 16.0, 32.0], p.pre_nms_topn, p.post_nms_topn,
                       p.nms_thresh, p.min_size)


KNOWN_PYTHON = {("rpn.proposal_layer", "ProposalLayer")}
_PY_KEYS = {"feat_stride", "scales", "ratios", "base_size"}


def _param_dict(layer: CaffeLayer, text: str) -> dict:
    """py-faster-rcnn's ``param_str`` (a YAML mapping such as ``'feat_stride': 16``) read as a
    Python literal; an empty string is an empty mapping."""
    text = text.strip()
    if not text:
        return {}
    try:
        val = ast.literal_eval(text if text.startswith("{") else "{" + text + "}")
    except (ValueError, SyntaxError):
        layer.fail(f"cannot read python_param.param_str {text!r} (expected e.g. \"'feat_stride': 16\")")
    if not isinstance(val, dict):
        layer.fail(f"python_param.param_str {text!r} is not a mapping")
    return val


@register("Python")
class PythonLayer(ProposalBase):
    """A ``Python`` layer. Only py-faster-rcnn's ``rpn.proposal_layer.ProposalLayer`` is known
    (a Proposal with its test-time config: scales from ``param_str`` (default 8, 16, 32), ratios
    0.5, 1, 2, base 16, pre/post NMS 6000/300, NMS 0.7); any other is refused at load, since its
    code is not part of the model files."""

    bottoms = (0, None)
    tops = (0, None)

    def setup(self, blobs, bottom_shapes):
        CaffeLayer.setup(self, blobs, bottom_shapes)
        p = self.layer_param.python_param
        key = (p.module, p.layer)
        if key not in KNOWN_PYTHON:
            self.fail(f"Python layer (module '{p.module}', class '{p.layer}') runs user code that is not in "
                      f"the model files, so it cannot be loaded. Replace it with a Caffe layer type, or "
                      f"remove it and the layers after it from the prototxt (for ONNX, cut the net before "
                      f"it with --onnx-outputs). Known Python layers: "
                      f"{', '.join(f'{m}.{c}' for m, c in sorted(KNOWN_PYTHON))}")
        nb, nt = len(self.layer_param.bottom), len(self.layer_param.top)
        if nb != 3 or nt not in (1, 2):
            self.fail(f"rpn.proposal_layer.ProposalLayer takes 3 bottoms (scores, deltas, im_info) and 1 or "
                      f"2 tops, got {nb} and {nt}")
        d = _param_dict(self, p.param_str)
        unknown = sorted(set(d) - _PY_KEYS)
        if unknown:
            self.fail(f"ProposalLayer param_str key(s) {unknown} are not understood (known: {sorted(_PY_KEYS)})")
        try:
            scales = [float(v) for v in d.get("scales", (8, 16, 32))]
            ratios = [float(v) for v in d.get("ratios", (0.5, 1, 2))]
            stride, base = int(d.get("feat_stride", 16)), int(d.get("base_size", 16))
        except (TypeError, ValueError):
            self.fail(f"ProposalLayer param_str {p.param_str!r} has a value of the wrong type")
        self.configure(stride, base, ratios, scales, 6000, 300, 0.7, 16)
