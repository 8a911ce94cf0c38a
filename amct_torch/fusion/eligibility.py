"""The rules (docs/fusion.md, "Eligibility") that decide whether a matched BN pattern may be folded.

Each rule is a small function returning None (allowed) or a one-line reason (refused), so that
``fuse_bn`` can report why a layer was left alone and each rule can be tested on its own.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from torch import fx

from amct_torch.caffe.layers import CaffeLayer
from amct_torch.caffe.layers.traits import folds_scale_before, is_fully_connected


def switch_reason(do_fusion: bool) -> Optional[str]:
    """Fusion switched off globally (quant config ``do_fusion: false``)."""
    return None if do_fusion else "do_fusion is false"


def skip_reason(names: Iterable[str], skip_layers: set[str], record_skip: set[str]) -> Optional[str]:
    """A layer of the pattern (normally the kept Convolution/InnerProduct) is named in the quant
    config's ``skip_fusion_layers`` or has ``skip_fusion: true`` in the record."""
    for name in names:
        if name in skip_layers:
            return f"'{name}' is in skip_fusion_layers"
        if name in record_skip:
            return f"the record sets skip_fusion for '{name}'"
    return None


def single_consumer_reason(node: fx.Node, name: str) -> Optional[str]:
    """The value must flow only into the next layer of the pattern. In-place Caffe layers are
    separate fx nodes, so a later layer reading the same blob name is a separate user here."""
    n = len(node.users)
    return None if n == 1 else f"the output of '{name}' has {n} consumers"


def batchnorm_reason(bn: CaffeLayer) -> Optional[str]:
    """BN must use its stored statistics. A deploy net runs in TEST phase, where Caffe uses the
    global statistics unless ``use_global_stats: false`` is written explicitly; then Caffe
    normalises with each batch's own statistics, which no constant can fold."""
    if getattr(bn, "uses_batch_stats", False):
        return f"BatchNorm '{bn.caffe_name}' sets use_global_stats: false (batch statistics)"
    return None


def scale_reason(scale: CaffeLayer, channels: int) -> Optional[str]:
    """The Scale must be a per-channel affine map: one bottom (its own γ blob), axis 1,
    num_axes 1, and one γ per channel."""
    p = scale.layer_param.scale_param
    if len(scale.layer_param.bottom) != 1 or getattr(scale, "weight", None) is None:
        return f"Scale '{scale.caffe_name}' takes its factor from a second bottom"
    if p.axis != 1 or p.num_axes != 1:
        return f"Scale '{scale.caffe_name}' acts on axis {p.axis} with num_axes {p.num_axes}, not axis 1 alone"
    if scale.weight.numel() != channels:
        return f"Scale '{scale.caffe_name}' has {scale.weight.numel()} factors for {channels} channels"
    return None


def output_layer_reason(layer: CaffeLayer, channels: int) -> Optional[str]:
    """The BN must normalise the layer's output channels: for InnerProduct that means the
    output is (N, num_output), i.e. ``axis: 1``."""
    if is_fully_connected(layer) and layer.layer_param.inner_product_param.axis != 1:
        return f"InnerProduct '{layer.caffe_name}' uses axis {layer.layer_param.inner_product_param.axis}"
    n = getattr(layer, "num_output", None)
    if n is not None and n != channels:
        return f"'{layer.caffe_name}' has {n} outputs, BatchNorm has {channels} channels"
    return None


def input_side_reason(conv: CaffeLayer, channels: int) -> Optional[str]:
    """BN+Scale folded into the following convolution is exact only without padding (the pad
    zeros would otherwise have to become −c/a) and with group 1."""
    if not folds_scale_before(conv):
        return f"input-side fusion only into Convolution, not {conv.caffe_type}"
    if getattr(conv, "groups", 1) != 1:
        return f"input-side fusion needs group 1, '{conv.caffe_name}' has group {conv.groups}"
    pad = getattr(conv, "padding", (0, 0))
    if any(p != 0 for p in pad):
        return f"input-side fusion needs pad 0, '{conv.caffe_name}' pads {list(pad)}"
    if conv.weight.shape[1] != channels:
        return f"'{conv.caffe_name}' takes {conv.weight.shape[1]} channels, BatchNorm has {channels}"
    return None
