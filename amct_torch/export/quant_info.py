"""The quant info JSON (``{save_path}_quant.json``): which layers were inserted and which original
layers each fused layer replaced, so a user can map the output model back to the model they gave.
``fused_layers`` lists, for each layer that absorbed others, its own name first and then the
absorbed names in model order. The layout: docs/export.md."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Optional

import torch

from amct_torch.caffe.graph import layer_modules
from amct_torch.export.caffe.netbuild import EmittedNet
from amct_torch.files.atomic import atomic_write_text


def fused_layers_of(gm: torch.fx.GraphModule) -> dict[str, list[str]]:
    """{kept layer: [absorbed layer names]} from the modules' ``fused_layers`` attribute."""
    out: dict[str, list[str]] = {}
    for name, mod in layer_modules(gm).items():
        absorbed = list(getattr(mod, "fused_layers", None) or [])
        if absorbed:
            out[name] = absorbed
    return out


def quant_info(emitted: EmittedNet, fused: Optional[Mapping[str, Sequence[str]]] = None) -> dict:
    """The quant info as a JSON-ready dict."""
    fused = fused or {}
    return {
        "version": 1,
        "quant_layers": [{"name": q.name, "type": "Quant", "bottom": q.bottom,
                          "quantized_layers": list(q.consumers), "scale_d": q.scale_d,
                          "offset_d": q.offset_d} for q in emitted.quants],
        "dequant_layers": [{"name": d, "type": "DeQuant", "layer": layer}
                           for layer, d in emitted.dequants.items()],
        "fused_layers": {kept: [kept] + [a for a in absorbed if a != kept]
                         for kept, absorbed in fused.items()},
    }


def write_quant_info(path: str, emitted: EmittedNet,
                     fused: Optional[Mapping[str, Sequence[str]]] = None) -> dict:
    """Write the quant info JSON atomically; returns the dict written."""
    info = quant_info(emitted, fused)
    atomic_write_text(path, json.dumps(info, indent=2) + "\n")
    return info
