"""Where the opt-in ``quantize_eltwise`` ONNX export (speed mode, not AMCT's semantics) puts its
extra Q/DQ pairs around each Eltwise SUM.

Why: ONNX Runtime runs an ``Add`` as the int8 ``QLinearAdd`` only when every input comes from a
``DequantizeLinear`` and the output goes to a ``QuantizeLinear``; AMCT's float Eltwise forces
float work around every ResNet block. Each input and the output gets the factors that cost the
least accuracy: those a consumer applies anyway (``consumer``), none when already quantized or
after a ReLU whose grid makes the pair exact (``keep``, ``relu``), else min/max factors from
calibration data (``calib``). Joint-quant entries and PROD/MAX are left alone; the choices are
detailed in docs/export.md."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from torch import fx

from amct_torch.caffe.layers import CaffeLayer
from amct_torch.caffe.layers.base import node_layer
from amct_torch.caffe.layers.structure import EltwiseLayer
from amct_torch.export.layer_quant import LayerQuant

_SUM = 1
Factor = tuple[str, float, int]  # (name of the Q/DQ pair, scale_d, offset_d)


@dataclass
class EltwiseQuant:
    """Per input: (kind, payload); output: (kind, payload). Payload: a Factor for ``consumer``,
    the layer whose output is calibrated for ``calib``, None for ``keep``/``relu``/``float``."""

    inputs: list[tuple[str, object]] = field(default_factory=list)
    output: tuple[str, object] = ("calib", None)


def _is_free_sum(mod: CaffeLayer, plan: Mapping[str, LayerQuant]) -> bool:
    """An Eltwise SUM without a joint-quant entry (the ones this mode quantizes)."""
    return isinstance(mod, EltwiseLayer) and mod.operation == _SUM and mod.caffe_name not in plan


def _consumer_factors(gm: fx.GraphModule, node: fx.Node, plan: Mapping[str, LayerQuant]) -> list[Optional[Factor]]:
    """For each user of ``node``: the factor with which that user quantizes ``node``'s value, or
    None where the user reads it in float. Users that are themselves speed-mode Eltwise SUMs are
    left out: in this mode they read the value through its Q/DQ."""
    out: list[Optional[Factor]] = []
    for user in node.users:
        mod = node_layer(gm, user)
        lq = plan.get(mod.caffe_name) if mod is not None else None
        if lq is None and mod is not None and _is_free_sum(mod, plan):
            continue
        if lq is not None and (lq.joint or user.args[0] is node):
            out.append((lq.name, float(lq.scale_d), int(lq.offset_d)))
        else:
            out.append(None)
    return out


def _single(factors: list[Optional[Factor]]) -> Optional[Factor]:
    """The one factor shared by all consumers (by value), or None."""
    if not factors or any(f is None for f in factors):
        return None
    vals = {(f[1], f[2]) for f in factors}  # type: ignore[index]
    return factors[0] if len(vals) == 1 else None


def eltwise_plan(gm: fx.GraphModule, plan: Mapping[str, LayerQuant],
                 residual: set[str]) -> dict[str, EltwiseQuant]:
    """{Eltwise name: EltwiseQuant} for every non-joint Eltwise SUM of ``gm``."""
    out: dict[str, EltwiseQuant] = {}
    for node in gm.graph.nodes:
        mod = node_layer(gm, node)
        if mod is None or not _is_free_sum(mod, plan):
            continue
        eq = EltwiseQuant()
        for arg in node.args:
            src = node_layer(gm, arg)
            if src is not None and src.caffe_name in residual:
                eq.inputs.append(("keep", None))
                continue
            first = next((f for f in _consumer_factors(gm, arg, plan) if f is not None), None)
            if first is not None:
                eq.inputs.append(("consumer", first))
            elif src is not None:
                eq.inputs.append(("calib", src.caffe_name))
            else:
                eq.inputs.append(("float", None))  # a network input: left as is
        own = _single(_consumer_factors(gm, node, plan))
        users = list(node.users)
        relu = node_layer(gm, users[0]) if len(users) == 1 else None
        if own is not None:
            eq.output = ("consumer", own)
        elif relu is not None and relu.caffe_type == "ReLU" and relu.negative_slope == 0.0 \
                and (f := _single(_consumer_factors(gm, users[0], plan))) is not None and f[2] == -128:
            eq.output = ("relu", None)
        else:
            eq.output = ("calib", mod.caffe_name)
        out[mod.caffe_name] = eq
    return out


def calibrated_layers(eplan: Mapping[str, EltwiseQuant]) -> list[str]:
    """Layers whose output needs min/max factors from calibration data."""
    names = [p for eq in eplan.values() for k, p in eq.inputs + [eq.output] if k == "calib"]
    return list(dict.fromkeys(names))  # type: ignore[arg-type]
