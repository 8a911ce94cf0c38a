"""YOLOv2's ``Reorg`` and ``Region`` layers as the Caffe YOLO forks and OpenCV run them
(darknet's reorg and region).

Why its own module: darknet's reorg is not PyTorch's pixel_unshuffle. It reads the input as if
it had the *output's* spatial layout (C/s² channels of (H·s)×(W·s)), so the channel order of
the result differs from a plain space-to-depth; nets trained with it depend on that order. The
region layer decodes boxes against anchors kept as the layer's blob, as OpenCV's Caffe importer
reads it.
"""
from __future__ import annotations

import torch

from amct_torch.caffe.layers.base import CaffeLayer, register


@register("Reorg")
class ReorgLayer(CaffeLayer):
    """Output (N, C·s², H/s, W/s) with out[(a·s + b)·C/s² + c, j, i] =
    in'[c, j·s + a, i·s + b], ``in'`` being the input's memory read as (C/s², H·s, W·s)."""

    def setup(self, blobs, bottom_shapes):
        super().setup(blobs, bottom_shapes)
        p = self.layer_param.reorg_param
        self.stride = int(p.stride)
        if self.stride < 1:
            self.fail(f"Reorg stride must be >= 1, got {self.stride}")
        if p.reverse:
            self.fail("Reorg with reverse: true is not supported (no reference implementation to check it "
                      "against); replace it or cut the net before it")
        if bottom_shapes is not None:
            self.infer_shapes(bottom_shapes)

    def infer_shapes(self, bottom_shapes):
        n, c, h, w = self._check(bottom_shapes[0])
        s = self.stride
        return [(n, c * s * s, h // s, w // s)]

    def _check(self, shape) -> tuple[int, int, int, int]:
        if len(shape) != 4:
            self.fail(f"Reorg takes a 4-D input, got {list(shape)}")
        n, c, h, w = (int(d) for d in shape)
        s = self.stride
        if c % (s * s) or h % s or w % s:
            self.fail(f"Reorg with stride {s} needs channels divisible by {s * s} and height and width by "
                      f"{s}, got {[n, c, h, w]}")
        return n, c, h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = self._check(tuple(x.shape))
        s = self.stride
        oc = c // (s * s)
        y = x.reshape(n, oc, h, s, w, s).permute(0, 3, 5, 1, 2, 4)  # (n, a, b, c2, j, i)
        return y.reshape(n, c * s * s, h // s, w // s)


@register("Region")
class RegionLayer(CaffeLayer):
    """YOLOv2's region layer as OpenCV's RegionLayer computes it. Input (N, H, W, A·(5 + C))
    (channels last: a Permute 0, 2, 3, 1 before it, as OpenCV's darknet importer writes);
    anchors (A pairs) from blob 0. Output (N·H·W·A, 5 + C) rows [x, y, w, h, objectness,
    class scores]: x = (col + σ(tx)) / W, y = (row + σ(ty)) / H, w = exp(tw)·anchor_w / W,
    h = exp(th)·anchor_h / H, objectness σ(to), class scores objectness × softmax (or σ with
    ``logistic``), zeroed unless > ``thresh``; with ``nms_threshold`` > 0, per class, greedy NMS
    over the image's boxes (scores > thresh, best first, IoU > nms_threshold suppressed) zeroes
    the suppressed scores. Old darknet's ``classfix`` is ignored, as OpenCV 4.x does."""

    bias: torch.Tensor  # the anchors buffer, always set (CaffeLayer's is Optional)

    def setup(self, blobs, bottom_shapes):
        p = self.layer_param.region_param
        counts = {v for v in (p.anchors if p.HasField("anchors") else None,
                              p.num if p.HasField("num") else None,
                              p.boxes_of_each_grid if p.HasField("boxes_of_each_grid") else None) if v is not None}
        if len(counts) > 1:
            self.fail(f"Region anchors, num and boxes_of_each_grid disagree: {sorted(counts)}")
        self.anchors = int(counts.pop()) if counts else 5
        self.classes, self.coords = int(p.classes), int(p.coords)
        self.softmax, self.logistic = bool(p.softmax), bool(p.logistic)
        self.thresh, self.nms_threshold = float(p.thresh), float(p.nms_threshold)
        if self.coords != 4:
            self.fail(f"Region supports coords 4 only, got {self.coords}")
        if self.classes < 1 or self.anchors < 1:
            self.fail(f"Region needs classes >= 1 and at least one anchor, got {self.classes} and {self.anchors}")
        if p.softmax_tree:
            self.fail("Region with softmax_tree (YOLO9000) is not supported (nor by OpenCV)")
        if not (self.softmax or self.logistic):
            self.fail("Region needs softmax or logistic class scores")
        if not self.nms_threshold >= 0:
            self.fail(f"Region nms_threshold must be >= 0, got {self.nms_threshold}")
        self.expect_blob_count(blobs, 1, 1)
        bias = torch.zeros(2 * self.anchors) if not blobs else self.blob_as(blobs[0], (2 * self.anchors,), "anchor")
        self.register_buffer("bias", bias)
        if bottom_shapes is not None:
            self.infer_shapes(bottom_shapes)

    def caffe_blobs(self):
        return [self.bias.detach().cpu().float().numpy().reshape(1, -1).copy()]

    @property
    def cell(self) -> int:
        return 5 + self.classes

    def infer_shapes(self, bottom_shapes):
        s = bottom_shapes[0]
        if len(s) != 4 or s[3] != self.anchors * self.cell:
            self.fail(f"Region takes (N, H, W, {self.anchors * self.cell}) (channels last: {self.anchors} anchors x "
                      f"(5 + {self.classes} classes)), got {list(s)}")
        return [(s[0] * s[1] * s[2] * self.anchors, self.cell)]

    def decode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, H·W·A, 4) boxes, (N, H·W·A) objectness, (N, H·W·A, C) thresholded scores."""
        n, h, w, _ = x.shape
        v = x.float().reshape(n, h, w, self.anchors, self.cell)
        dev = x.device
        col = torch.arange(w, device=dev, dtype=torch.float32).view(1, 1, w, 1)
        row = torch.arange(h, device=dev, dtype=torch.float32).view(1, h, 1, 1)
        aw = self.bias[0::2].float().view(1, 1, 1, -1)
        ah = self.bias[1::2].float().view(1, 1, 1, -1)
        bx = (col + torch.sigmoid(v[..., 0])) / w
        by = (row + torch.sigmoid(v[..., 1])) / h
        bw = torch.exp(v[..., 2]) * aw / w
        bh = torch.exp(v[..., 3]) * ah / h
        obj = torch.sigmoid(v[..., 4])
        cls = torch.softmax(v[..., 5:], dim=-1) if self.softmax else torch.sigmoid(v[..., 5:])
        prob = obj.unsqueeze(-1) * cls
        prob = torch.where(prob > self.thresh, prob, torch.zeros_like(prob))
        boxes = torch.stack([bx, by, bw, bh], dim=-1).reshape(n, -1, 4)
        return boxes, obj.reshape(n, -1), prob.reshape(n, -1, self.classes)

    def _nms(self, boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Scores with the suppressed ones zeroed (one image, one class). Greedy, as Darknet:
        the IoU of every ordered pair of candidates is computed on the device at once and read
        back once; the greedy pass then runs over that matrix on the host (one read per image
        and class instead of one per candidate)."""
        idx = torch.nonzero(scores > self.thresh).flatten()
        out = torch.zeros_like(scores)
        if idx.numel() == 0:
            return out
        order = idx[torch.sort(scores[idx], descending=True, stable=True).indices]
        b = boxes[order]
        x1, y1 = b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2
        x2, y2 = x1 + b[:, 2], y1 + b[:, 3]
        area = b[:, 2] * b[:, 3]
        iw = (torch.minimum(x2[:, None], x2[None, :]) - torch.maximum(x1[:, None], x1[None, :])).clamp(min=0)
        ih = (torch.minimum(y2[:, None], y2[None, :]) - torch.maximum(y1[:, None], y1[None, :])).clamp(min=0)
        inter = iw * ih
        over = (inter / (area[:, None] + area[None, :] - inter) > self.nms_threshold).cpu().numpy()
        keep: list[int] = []
        for i in range(len(over)):
            if not over[i, keep].any():
                keep.append(i)
        kk = order[torch.tensor(keep, device=order.device)]
        out[kk] = scores[kk]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.infer_shapes([tuple(x.shape)])
        boxes, obj, prob = self.decode(x)
        if self.nms_threshold > 0:
            prob = torch.stack([torch.stack([self._nms(boxes[i], prob[i, :, c]) for c in range(self.classes)], dim=1)
                                for i in range(x.shape[0])])
        out = torch.cat([boxes, obj.unsqueeze(-1), prob], dim=-1)
        return out.reshape(-1, self.cell).to(x.dtype)
