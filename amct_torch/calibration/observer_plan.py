"""Which activations are calibrated, and which layers share them.

Why a plan: layers reading the same blob with the same activation config share
one calibration (same data, same factors, computed once), and with ``joint_quant`` the inputs
of every Eltwise SUM share one factor calibrated on all of them together. Deciding that once,
from the graph and the per-layer configs, keeps the hooks trivial: one observer per group, fed
by one hook.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from torch import fx

from amct_torch.caffe.layers.base import node_layer
from amct_torch.config.act_algos import act_key
from amct_torch.config.types import LayerQuantConfig

#: Caffe EltwiseParameter.operation value of SUM (the default)
ELTWISE_SUM = 1


@dataclass
class CalibGroup:
    """One activation calibration.

    ``layers``: record keys that receive its factors (quantized layers reading ``blob``, or the
    Eltwise layer for a joint group); ``hook_target``: the submodule whose forward pre-hook
    feeds the observer; ``arg_indices``: which positional inputs of that module are fed
    (``(0,)`` for a quantized layer, every bottom for a joint Eltwise); ``joint``: recorded
    with scale_d/offset_d only.
    """

    blob: str
    config: LayerQuantConfig
    layers: list[str]
    hook_target: str
    arg_indices: tuple[int, ...] = (0,)
    joint: bool = False
    shape: Optional[tuple[int, int, int]] = field(default=None)


def _input_blob(node: fx.Node) -> str:
    arg = node.args[0] if node.args else None
    if isinstance(arg, fx.Node):
        return arg.meta.get("caffe_blob") or arg.name
    return repr(arg)


def build_plan(gm: fx.GraphModule, layer_configs: Mapping[str, LayerQuantConfig],
               joint_quant: bool = False,
               joint_config: Optional[LayerQuantConfig] = None) -> list[CalibGroup]:
    """The calibration groups of ``gm`` for the enabled layers of ``layer_configs``.

    Groups are in graph order. A quantized layer is keyed by the fx node it reads (one node =
    one blob value, so in-place rebinding of a Caffe blob name cannot merge different
    values) and its ``act_key``. With ``joint_quant`` every Eltwise SUM gets a joint group
    calibrated with ``joint_config`` (default: IFMR defaults)."""
    groups: list[CalibGroup] = []
    by_key: dict[tuple, CalibGroup] = {}
    for node in gm.graph.nodes:
        mod = node_layer(gm, node)
        if mod is None:
            continue
        name = mod.caffe_name
        cfg = layer_configs.get(name)
        if cfg is not None and cfg.quant_enable:
            src = node.args[0] if node.args else None
            key = (src.name if isinstance(src, fx.Node) else repr(src), act_key(cfg))
            group = by_key.get(key)
            if group is None:
                group = CalibGroup(blob=_input_blob(node), config=cfg, layers=[], hook_target=node.target)
                by_key[key] = group
                groups.append(group)
            group.layers.append(name)
        elif joint_quant and mod.caffe_type == "Eltwise" and \
                int(mod.layer_param.eltwise_param.operation) == ELTWISE_SUM:
            groups.append(CalibGroup(blob=",".join(str(a) for a in node.args),
                                     config=joint_config or LayerQuantConfig(), layers=[name],
                                     hook_target=node.target,
                                     arg_indices=tuple(range(len(node.args))), joint=True))
    return groups
