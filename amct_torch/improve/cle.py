"""Cross-layer equalization (opt-in, beyond AMCT; Nagel et al. 2019): the per-channel weight
ranges of two consecutive layers balanced by a positive rescaling that leaves the float model's
function unchanged.

Why: per-tensor grids waste their levels when a few channels have much larger ranges than the
rest (typical of depthwise layers after BN folding). Through a positively homogeneous activation
(ReLU, PReLU) output channel i of the first layer can be divided by s_i and input channel i of
the second multiplied by it; s_i = sqrt(r1_i / r2_i) makes both ranges sqrt(r1_i·r2_i). Pairs:
Convolution/ConvolutionDepthwise/InnerProduct → ReLU/PReLU → the same, each read by the next
only; chains are swept a few times. docs/algorithms.md, "Improvements beyond AMCT"."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

import torch
from torch import fx

from amct_torch.caffe.layers import CaffeLayer
from amct_torch.caffe.layers.base import node_layer
from amct_torch.caffe.layers.traits import is_fully_connected, is_transposed, is_weighted

#: the positively homogeneous activations a pair may pass through (f(s·x) = s·f(x), s > 0)
_HOMOGENEOUS = ("ReLU", "PReLU")


@dataclass
class Pair:
    """Two layers joined by a positively homogeneous activation; ``scale`` (on the layers'
    device, float32 [C]) is the accumulated s of the second layer's input channels."""

    first: str
    act: str
    second: str
    scale: Optional[torch.Tensor] = None


def _linear(mod: Optional[CaffeLayer]) -> bool:
    return (mod is not None and is_weighted(mod) and not is_transposed(mod) and not getattr(mod, "integer", False)
            and getattr(mod, "weight", None) is not None
            and not (is_fully_connected(mod) and (getattr(mod, "axis", 1) != 1)))


def find_pairs(gm: fx.GraphModule, allowed: Optional[Iterable[str]] = None) -> list[Pair]:
    """The equalizable pairs of ``gm`` in graph order; ``allowed``: layer names both members
    must be among (e.g. the quantized layers); a module called from several nodes is never
    paired (its weights serve other uses too)."""
    ok = None if allowed is None else set(allowed)
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in gm.graph.nodes:
        first = node_layer(gm, node)
        if first is None or not _linear(first) or calls[node.target] != 1 or len(node.users) != 1:
            continue
        act_node = next(iter(node.users))
        act = node_layer(gm, act_node)
        if act is None or act.caffe_type not in _HOMOGENEOUS or len(act_node.users) != 1 \
                or calls[act_node.target] != 1 or act_node.args[0] is not node:
            continue
        sec_node = next(iter(act_node.users))
        second = node_layer(gm, sec_node)
        if second is None or not _linear(second) or calls[sec_node.target] != 1 or sec_node.args[0] is not act_node \
                or len(sec_node.args) != 1:
            continue
        if ok is not None and (first.caffe_name not in ok or second.caffe_name not in ok):
            continue
        if not is_fully_connected(second) and is_fully_connected(first):
            continue  # an InnerProduct's output is N×C only: no convolution reads it per channel
        pairs.append(Pair(first.caffe_name, act.caffe_name, second.caffe_name))
    return pairs


def _in_channel_view(mod: CaffeLayer, channels: int) -> Optional[torch.Tensor]:
    """The second layer's weight as [groups, out per group, in per group, rest] so that input
    channel i is (i // in_per_group, :, i % in_per_group, :); None when it does not read
    ``channels`` channels."""
    w = mod.weight.data
    if is_fully_connected(mod):
        if w.shape[1] % channels:
            return None
        return w.reshape(1, w.shape[0], channels, -1)
    g = int(getattr(mod, "groups", 1))
    if w.shape[1] * g != channels:
        return None
    return w.reshape(g, w.shape[0] // g, w.shape[1], -1)


def _second_ranges(view: torch.Tensor) -> torch.Tensor:
    """max|W2[:, i]| per input channel i (groups concatenated in channel order)."""
    return view.abs().amax(dim=(1, 3)).reshape(-1)


def _apply(first: CaffeLayer, act: CaffeLayer, second: CaffeLayer, s: torch.Tensor) -> None:
    """W1_i /= s_i, b1_i /= s_i, W2[:, i] *= s_i (exact for a positive s and ReLU/PReLU)."""
    c = s.numel()
    w1 = first.weight.data
    first.weight.data = w1 / s.reshape((c,) + (1,) * (w1.dim() - 1)).to(w1.dtype)
    if first.bias is not None:
        first.bias.data = first.bias.data / s.to(first.bias.dtype)
    view = _in_channel_view(second, c)
    assert view is not None
    g, o, i, _ = view.shape
    scaled = view * s.reshape(g, 1, i, 1).to(view.dtype)
    second.weight.data = scaled.reshape(second.weight.shape).contiguous()


def equalize(gm: fx.GraphModule, pairs: list[Pair], sweeps: int = 20, eps: float = 1e-8) -> list[Pair]:
    """Equalize ``pairs`` of ``gm`` in place (``sweeps`` passes over them, in order) and return
    those applied, each with its accumulated per-channel ``scale``. A channel where either range
    is ~0 keeps s = 1 (nothing to balance)."""
    mods = {n: m for n, m in ((m.caffe_name, m) for m in gm.modules() if isinstance(m, CaffeLayer))}
    done: list[Pair] = []
    for p in pairs:
        first, second = mods[p.first], mods[p.second]
        c = first.weight.shape[0]
        if _in_channel_view(second, c) is None:
            continue
        p.scale = torch.ones(c, dtype=torch.float32, device=first.weight.device)
        done.append(p)
    for _ in range(max(1, sweeps)):
        for p in done:
            first, act, second = mods[p.first], mods[p.act], mods[p.second]
            w1 = first.weight.data
            r1 = w1.abs().reshape(w1.shape[0], -1).amax(dim=1).double()
            view = _in_channel_view(second, w1.shape[0])
            assert view is not None  # find_pairs kept only pairs whose channels match
            r2 = _second_ranges(view).double()
            good = (r1 > eps) & (r2 > eps)
            s = torch.where(good, torch.sqrt(r1.clamp_min(eps) / r2.clamp_min(eps)), torch.ones_like(r1))
            _apply(first, act, second, s.float())
            p.scale = s.float() if p.scale is None else p.scale * s.float()
    return done
