"""YOLOv2's ``Reorg`` layer as the Caffe YOLO forks and OpenCV run it (darknet's reorg).

Why its own module: darknet's reorg is not PyTorch's pixel_unshuffle. It reads the input as if
it had the *output's* spatial layout (C/s² channels of (H·s)×(W·s)), so the channel order of
the result differs from a plain space-to-depth; nets trained with it depend on that order.
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
