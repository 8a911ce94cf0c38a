"""Factors for the opt-in ``quantize_residual_outputs`` ONNX export (not AMCT semantics).

Why: in AMCT's fake-quant model a quantized Conv/InnerProduct whose output feeds an Eltwise
(a ResNet branch end or projection shortcut) has no quantizer after it, so ONNX Runtime can
only run it as a float convolution. Giving that output its own Q/DQ pair lets ORT use int8
kernels there as well, at the cost of one more rounding per residual branch. The factors are
asymmetric min/max over calibration data seen by the torch fake-quant model (zero exactly
representable), in the IFMR form: scale = (max − min)/255, offset = −round(min/scale) − 128.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional, Union

import numpy as np
import torch
from torch import fx

from amct_torch.caffe.graph import layer_modules
from amct_torch.caffe.layers.base import node_layer
from amct_torch.caffe.layers.traits import is_weighted
from amct_torch.errors import ExportError
from amct_torch.export.layer_quant import LayerQuant

Batches = Union[np.ndarray, torch.Tensor, Iterable[Union[np.ndarray, torch.Tensor]]]


def residual_layers(gm: fx.GraphModule, plan: Mapping[str, LayerQuant]) -> list[str]:
    """Quantized Conv/Deconv/InnerProduct layers with an Eltwise among their consumers that has
    no joint-quant entry (so nothing quantizes the layer's output), in graph order."""
    mods = layer_modules(gm)
    by_node = {n: layer.caffe_name for n in gm.graph.nodes if (layer := node_layer(gm, n)) is not None}
    out = []
    for node, name in by_node.items():
        lq = plan.get(name)
        if lq is None or not is_weighted(lq.type):
            continue
        for user in node.users:
            uname = by_node.get(user)
            if uname is not None and mods[uname].caffe_type == "Eltwise" and uname not in plan:
                out.append(name)
                break
    return out


def residual_output_factors(fq_gm: fx.GraphModule, names: list[str], calibration_data: Batches,
                            file: Optional[str] = None) -> dict[str, tuple[float, int]]:
    """(scale, offset) per layer in ``names`` from the min/max of its output in the torch
    fake-quant model ``fq_gm`` over ``calibration_data`` (one batch array or an iterable of
    batches for the single network input)."""
    if isinstance(calibration_data, (np.ndarray, torch.Tensor)):
        calibration_data = [calibration_data]
    mods = layer_modules(fq_gm)
    lo = {n: 0.0 for n in names}
    hi = {n: 0.0 for n in names}

    def hook(n):
        def f(_m, _a, out):
            lo[n] = min(lo[n], float(out.min()))
            hi[n] = max(hi[n], float(out.max()))
        return f

    handles = [mods[n].register_forward_hook(hook(n)) for n in names]
    try:
        device = next(fq_gm.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    seen = 0
    try:
        with torch.no_grad():
            for batch in calibration_data:
                x = torch.as_tensor(np.asarray(batch, np.float32) if not torch.is_tensor(batch) else batch)
                fq_gm(x.to(device, torch.float32))
                seen += 1
    finally:
        for h in handles:
            h.remove()
    if not seen:
        raise ExportError("quantize_residual_outputs needs at least one calibration batch", file=file)
    out = {}
    for n in names:
        if not (np.isfinite(lo[n]) and np.isfinite(hi[n])):
            raise ExportError("non-finite output in calibration data", file=file, layer=n)
        scale = float(np.float32((hi[n] - lo[n]) / 255))
        if scale < 1.1920929e-07:
            scale = 1.0
        out[n] = (scale, int(np.clip(-round(lo[n] / scale) - 128, -128, 127)))
    return out
