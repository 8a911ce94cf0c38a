"""A torch fake-quant model from a fused float graph and a record, built with hooks.

Why here (besides the exporters' Caffe/ONNX writers): the per-layer report, the one-call API
and the benchmarks need the int8-equivalent model in torch on any device, with the very same
module names as the float graph so that a layer's output can be compared with its float
counterpart. It is SPEC §5.4/§5.1 exactly: each quantized layer's input goes through
``fake_quant(x, scale_d, offset_d)`` and its weight is replaced by the ARQ fake-quant weight
from the record's ``scale_w``; with joint entries each Eltwise SUM input is fake-quantized
with the Eltwise's factor.
"""
from __future__ import annotations

import copy
from typing import Mapping

import torch
from torch import fx, nn

from amct_torch.algorithms.quant import QMAX, QMIN, channel_view, fake_quant
from amct_torch.caffe.layers import CaffeLayer
from amct_torch.errors import RecordError
from amct_torch.record.types import LayerRecord


def _input_quant_hook(scale: float, offset: int, indices: tuple[int, ...]):
    def hook(_module: nn.Module, args: tuple) -> tuple:
        out = list(args)
        for i in indices:
            out[i] = fake_quant(args[i], scale, offset)
        return tuple(out)
    return hook


def _fake_quant_weight(mod: CaffeLayer, r: LayerRecord, name: str) -> None:
    w = mod.weight.detach()
    scale = torch.tensor(r.scale_w, dtype=torch.float32, device=w.device)
    s = channel_view(scale, tuple(w.shape), mod.caffe_type, int(getattr(mod, "groups", 1)))
    q = torch.round(w.float() / s).clamp_(QMIN, QMAX)
    mod.weight = nn.Parameter((q * s).to(w.dtype), requires_grad=False)


def fake_quant_model(fused: fx.GraphModule, records: Mapping[str, LayerRecord],
                     path: str = "<record>") -> fx.GraphModule:
    """A deep copy of ``fused`` computing the fake-quant model of ``records``.

    Every record key must name a layer of ``fused``; quantized layers (Convolution,
    Deconvolution, InnerProduct, AVE Pooling) get input and weight fake-quant, an Eltwise key
    (joint_quant) gets input fake-quant on all its bottoms. The copy has no other hooks."""
    from amct_torch.caffe.graph import layer_modules

    gm = copy.deepcopy(fused)
    for m in gm.modules():
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()
    mods = layer_modules(gm)
    for name, r in records.items():
        mod = mods.get(name)
        if mod is None:
            raise RecordError("record layer not found in the model", file=path, layer=name)
        if r.scale_d is None or r.offset_d is None:
            raise RecordError("no activation factors (scale_d/offset_d): calibration did not "
                              "finish for this layer", file=path, layer=name)
        if mod.caffe_type == "Eltwise":
            nb = len(mod.layer_param.bottom)
            mod.register_forward_pre_hook(_input_quant_hook(r.scale_d, r.offset_d, tuple(range(nb))))
            continue
        mod.register_forward_pre_hook(_input_quant_hook(r.scale_d, r.offset_d, (0,)))
        if getattr(mod, "weight", None) is not None and r.scale_w:
            _fake_quant_weight(mod, r, name)
    return gm
