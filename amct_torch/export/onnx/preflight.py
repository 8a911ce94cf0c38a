"""Checks, before calibration starts, that every requested output can be written.

Why: an ONNX mapping problem (a layer type or parameter without an ONNX equivalent) is a
property of the model, known as soon as it is loaded; finding it only after a long calibration,
and naming a temporary record file, wastes the user's time. ``onnx_preflight`` builds the float
ONNX model in memory (the same code path the exporter takes, nothing written) and returns the
problem as an ``ExportError`` naming the user's model file and the layer. The caller calibrates
anyway, writes the outputs that can be written (the Caffe models) and raises the problem at the
end (exit 2 in the CLI) with ``raise_if``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from torch import fx

from amct_torch.errors import AmctError, ExportError

log = logging.getLogger("amct_torch")


def onnx_preflight(gm: fx.GraphModule, model_file: str,
                   outputs: Optional[Sequence[str]] = None, config: Any = None) -> Optional[ExportError]:
    """The reason the ONNX models of ``gm`` cannot be written, or None. Logs a warning at once
    when there is one (the user learns it before calibration, which continues). With the quant
    ``config`` (a QuantConfig) the quantized model's own constraint is checked too: per-channel
    Deconvolution weights with group > 1 have no single ONNX quantization axis."""
    from amct_torch.export.onnx.qdq import _build
    problem = _quant_problem(gm, model_file, config) if config is not None else None
    if problem is not None:
        log.warning("%s -- the ONNX models will not be written; the other outputs will", problem)
        return problem
    try:
        # the fixed-size build: a symbolic spatial size only changes how sizes are written,
        # never whether a layer maps, and skips the spatial probe's forward pass
        _build(gm, {}, "uint8", model_file, "float", outputs=outputs, dynamic_spatial=False)
    except AmctError as err:  # a mapping, or a layer's own check while probing shapes
        msg = err.message if err.message.startswith("ONNX export") else f"ONNX export: {err.message}"
        problem = ExportError(msg, file=model_file, layer=err.layer)
    else:
        return None
    log.warning("%s -- the ONNX models will not be written; the other outputs will", problem)
    return problem


def _quant_problem(gm: fx.GraphModule, model_file: str, config: Any) -> Optional[ExportError]:
    from amct_torch.caffe.graph import layer_modules
    mods = layer_modules(gm)
    for name, lc in getattr(config, "layers", {}).items():
        mod = mods.get(name)
        if (mod is not None and lc.quant_enable and lc.channel_wise and mod.caffe_type == "Deconvolution"
                and getattr(mod, "groups", 1) > 1):
            return ExportError("ONNX export: per-channel Deconvolution weights with group > 1 have no "
                               "single ONNX quantization axis; set channel_wise false for this layer "
                               "(quant.cfg override_layer_configs) or skip it", file=model_file, layer=name)
    return None


def raise_if(problem: Optional[ExportError]) -> None:
    """Raise the preflight's problem (call it after the other outputs were written)."""
    if problem is not None:
        raise problem
