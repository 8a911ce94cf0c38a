"""The load step: the Caffe model, its weights checked, the JSON quant config read against it.

Why the weight checks here: NaN/Inf weights, or weights too large for a plausible int8 scale,
surface much later as NaN activations of another layer or as a bad record entry; refused at
load they name the caffemodel and the layer at fault.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import torch

from amct_torch.caffe.duplicate_names import refuse_quantized_duplicates
from amct_torch.errors import ModelError
from amct_torch.steps.graph import QuantGraph

log = logging.getLogger("amct_torch")


def load(config_file: str, model_file: str, weights_file: str) -> QuantGraph:
    """Load the model, refuse unusable weights, read and validate the JSON quant config."""
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.config import layer_infos_from_net, read_quant_config_json

    model = load_caffe(model_file, weights_file)
    check_finite_weights(model, weights_file)
    layers = layer_infos_from_net(model.caffe_net)
    config = read_quant_config_json(config_file, layers)
    refuse_quantized_duplicates(model.caffe_net.layer, config.enabled_layers(), model_file)
    log.info("loaded %s: %d layers, %d to quantize", model_file, len(layers),
             len(config.enabled_layers()))
    return QuantGraph(model_file=model_file, weights_file=weights_file, config_file=config_file,
                      config=config, layers=layers, model=model)


def check_finite_weights(model: Any, weights_file: str) -> None:
    """Refuse NaN/Inf weights, and weights so large that scale_w would leave the record's
    plausible range (``ModelError`` naming the caffemodel and the layer)."""
    from amct_torch.caffe.graph import layer_modules
    from amct_torch.record.validate import SCALE_MAX

    for name, mod in layer_modules(model).items():
        # min and max alone (NaN propagates into both, an Inf shows in one), no copy: a mask
        # and an abs() of a VGG-16 fc6 were 0.5 GB
        extremes: dict[int, tuple[float, float]] = {}
        for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
            if t.is_floating_point() and t.numel():
                lo, hi = (float(v) for v in torch.aminmax(t.detach()))
                extremes[id(t)] = (lo, hi)
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    raise ModelError("the weights hold NaN or Inf values", file=weights_file,
                                     layer=name)
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.is_floating_point() and w.numel():
            lo, hi = extremes.get(id(w)) or (float(v) for v in torch.aminmax(w.detach()))
            peak = max(abs(lo), abs(hi))
            if peak > 127 * SCALE_MAX:  # scale_w = peak/127 would break the record's rule
                raise ModelError(f"weights reach {peak:.3g}: beyond what int8 weights with a "
                                 f"plausible scale (at most {SCALE_MAX:g}) can represent",
                                 file=weights_file, layer=name)
