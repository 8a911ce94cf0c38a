"""What the config and record layers need to know about a model: one ``LayerInfo`` per layer.

Keeping this small record separate from the torch graph lets quant.cfg, JSON config and record
validation run (and be tested) without loading weights. ``layer_infos_from_net`` derives the
list from a Caffe ``NetParameter`` with the rules of docs/config_and_record.md, "Quantizable layers".
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from amct_torch.caffe.netio import layer_included, test_state
from amct_torch.caffe.quant_types import QUANT_TYPES

# V1 (`layers`) enum values of the quantizable types, mapped to their type strings.
_V1_TYPES = {4: "Convolution", 39: "Deconvolution", 14: "InnerProduct", 17: "Pooling"}


@dataclass(frozen=True)
class LayerInfo:
    """One Caffe layer as the config/record code sees it.

    ``quantizable`` already includes the per-layer constraints (AVE and not global pooling,
    Deconvolution dilation 1, InnerProduct axis 1 and not transposed, 2-D convolution).
    ``out_channels`` is ``num_output`` of weighted layers (bounds ``len(scale_w)``).
    """

    name: str
    type: str
    quantizable: bool
    weighted: bool
    out_channels: Optional[int] = None


def _info(name: str, ltype: str, layer: Any) -> LayerInfo:
    quant = QUANT_TYPES.get(ltype)  # torch-free: the layer classes take their traits from it
    if quant is None:
        return LayerInfo(name, ltype, False, False)
    out_c = None
    if quant.weight_param is not None:
        p = getattr(layer, quant.weight_param)
        out_c = int(p.num_output) if p.HasField("num_output") else None
    return LayerInfo(name, ltype, quant.takes(layer), quant.weight_layout is not None, out_c)


def layer_infos_from_net(net_param: Any) -> list[LayerInfo]:
    """``LayerInfo`` of every layer of a Caffe ``NetParameter`` that ``caffe test`` builds
    (its include/exclude rules met by ``netio.test_state``), in file order.

    New-style ``layer`` entries are used when present, else the V1 ``layers`` entries (their
    enum types are mapped to type strings; non-quantizable V1 types keep their enum name).
    """
    out: list[LayerInfo] = []
    state = test_state(net_param)
    if len(net_param.layer) > 0:
        for layer in net_param.layer:
            if layer_included(layer, state):
                out.append(_info(layer.name, layer.type, layer))
        return out
    for layer in net_param.layers:
        if not layer_included(layer, state):
            continue
        ltype = _V1_TYPES.get(int(layer.type))
        if ltype is None:
            enum = layer.DESCRIPTOR.fields_by_name["type"].enum_type
            value = enum.values_by_number.get(int(layer.type))
            ltype = value.name if value is not None else str(int(layer.type))
        out.append(_info(layer.name, ltype, layer))
    return out


def quantizable_layers(layers: Iterable[LayerInfo]) -> list[LayerInfo]:
    """The quantizable layers, sorted by name (the order of the JSON config)."""
    return sorted((l for l in layers if l.quantizable), key=lambda l: l.name)
