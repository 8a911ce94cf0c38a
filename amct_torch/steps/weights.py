"""The fuse + ARQ step: BN folded into the quantized layers, then their weight factors.

Why together: ARQ runs on the fused weights (the factors must fit the weights the models are
written from), and which layers stay unfused decides their record's ``skip_fusion``, which
``convert_model`` needs to rebuild the same weights later.
"""
from __future__ import annotations

import logging
from typing import Any

from amct_torch.config.types import LayerQuantConfig
from amct_torch.errors import ModelError
from amct_torch.record import LayerRecord, add_weight_factors, as_stored
from amct_torch.steps.graph import QuantGraph

log = logging.getLogger("amct_torch")


def fuse(graph: QuantGraph) -> Any:
    """BN fusion honouring ``do_fusion``/``skip_fusion_layers``; sets ``graph.fused``.

    Layers that stay unfused because of the config are remembered in ``graph.skip_fusion``:
    their record entries get ``skip_fusion: true`` so that ``convert_model`` rebuilds the
    same (unfused) weights the factors were computed on."""
    from amct_torch.fusion import fuse_bn

    qc = graph.config
    result = fuse_bn(graph.model, do_fusion=qc.do_fusion, skip_fusion_layers=qc.skip_fusion_layers,
                     file=graph.model_file)
    graph.fused = result.graph
    graph.fused_layers = {k: list(v) for k, v in result.fused.items()}
    wanted = set(graph.quant_layers)
    named = set(qc.skip_fusion_layers)
    graph.skip_fusion = [n for n in result.refused
                         if n in wanted and (n in named or not qc.do_fusion)]
    log.info("BN fusion: %d layer(s) fused, %d pattern(s) left unfused", len(result.fused),
             len(result.refused))
    return graph.fused


def weight_factors(gm: Any, configs: dict[str, LayerQuantConfig], file: str
                   ) -> dict[str, tuple[list[float], list[int]]]:
    """ARQ factors of every enabled layer of ``gm`` (AVE Pooling: the neutral [1.0], [0])."""
    from amct_torch.algorithms.arq import arq_scale_w
    from amct_torch.caffe.graph import layer_modules

    mods = layer_modules(gm)
    out: dict[str, tuple[list[float], list[int]]] = {}
    for name, cfg in configs.items():
        if not cfg.quant_enable:
            continue
        mod = mods.get(name)
        if mod is None:
            raise ModelError("layer of the quant config is missing from the model", file=file,
                             layer=name)
        if mod.caffe_type == "Pooling":
            out[name] = ([1.0], [0])
            continue
        # the scales alone: ARQ's int8 and fake-quant weights are made by the exporters
        scale_w = arq_scale_w(mod.weight.detach(), mod.caffe_type, cfg.channel_wise,
                              int(getattr(mod, "groups", 1)))
        out[name] = ([float(s) for s in scale_w.cpu().tolist()], [0] * int(scale_w.numel()))
    return out


def quantize_weights(graph: QuantGraph) -> dict[str, LayerRecord]:
    """Fuse, then ARQ on the fused weights: ``graph.records`` becomes the weight part of the
    record (scale_w/offset_w, and skip_fusion), as the file would hold it; returns it."""
    fuse(graph)
    factors = weight_factors(graph.fused, graph.config.layers, graph.model_file)
    graph.records = as_stored(add_weight_factors({}, factors, skip_fusion=graph.skip_fusion),
                              graph.record_file)
    return graph.records
