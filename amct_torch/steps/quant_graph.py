"""The steps behind AMCT's ``init`` / ``quantize_model``: the graph object they pass around,
BN fusion, ARQ weight factors, and the calibration session with its record merger.

Why separate from ``api.py``: the public functions stay thin (argument checks, AMCT's names),
and the one-call API, the CLI and the tests reuse these steps without going through files
they do not need.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from amct_torch.calibration.observer_plan import CalibGroup, build_plan
from amct_torch.calibration.session import CalibrationSession, Factors, group_summary
from amct_torch.config.layers import LayerInfo
from amct_torch.config.types import LayerQuantConfig, QuantConfig
from amct_torch.errors import ModelError
from amct_torch.record import merge_activation_factors, write_weight_factors

log = logging.getLogger("amct_torch")


@dataclass
class QuantGraph:
    """What ``init`` returns and the later calls take (AMCT's "graph").

    ``model``: the float graph as loaded; ``fused``: after BN fusion (set by
    ``quantize_model``); ``session``: the running calibration; ``fused_layers``: kept layer →
    the BN/Scale names it absorbed (for the quant info JSON)."""

    model_file: str
    weights_file: str
    config_file: str
    record_file: str
    config: QuantConfig
    layers: list[LayerInfo]
    model: Any
    fused: Any = None
    session: Optional[CalibrationSession] = None
    fused_layers: dict[str, list[str]] = field(default_factory=dict)
    skip_fusion: list[str] = field(default_factory=list)
    groups: list[CalibGroup] = field(default_factory=list)

    @property
    def quant_layers(self) -> list[str]:
        """Names of the layers that will be quantized (record keys, joint entries excluded)."""
        return self.config.enabled_layers()

    @property
    def joint_layers(self) -> list[str]:
        """Eltwise layers that get a joint activation factor (``joint_quant``)."""
        return [g.layers[0] for g in self.groups if g.joint]


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
    from amct_torch.algorithms.arq import arq_quantize
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
        res = arq_quantize(mod.weight.detach(), mod.caffe_type, cfg.channel_wise,
                           int(getattr(mod, "groups", 1)))
        out[name] = ([float(s) for s in res.scale_w.cpu().tolist()],
                     [int(o) for o in res.offset_w.cpu().tolist()])
    return out


def joint_config(qc: QuantConfig) -> LayerQuantConfig:
    """Activation config of a joint Eltwise group: IFMR defaults, asymmetric as
    ``activation_offset`` (quant.cfg has no per-layer config for Eltwise)."""
    return LayerQuantConfig(asymmetric=qc.activation_offset)


def start_calibration(graph: QuantGraph, ifmr_mode: str = "streaming") -> CalibrationSession:
    """Plan the groups and attach a session to ``graph.fused`` whose result is merged into the
    record file."""
    qc = graph.config
    graph.groups = build_plan(graph.fused, qc.layers, joint_quant=qc.joint_quant,
                              joint_config=joint_config(qc))
    for first, members in group_summary(graph.groups).items():
        log.info("layers %s read the same input with the same config: calibrated once", members)

    def merge(factors: Factors) -> None:
        merge_activation_factors(graph.record_file, factors)

    graph.session = CalibrationSession(graph.fused, graph.groups, qc.batch_num, on_finish=merge,
                                       ifmr_mode=ifmr_mode)
    return graph.session


def write_weights(graph: QuantGraph) -> None:
    """ARQ on the fused weights → scale_w/offset_w (and skip_fusion) in the record."""
    factors = weight_factors(graph.fused, graph.config.layers, graph.model_file)
    write_weight_factors(graph.record_file, factors, skip_fusion=graph.skip_fusion)


def check_writable(path: str, what: str) -> None:
    """Fail early (before any work) when the folder of an output file does not exist."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        from amct_torch.errors import AmctError
        raise AmctError(f"cannot write the {what}: folder {folder} does not exist", file=path)


def check_finite_weights(model: Any, weights_file: str) -> None:
    """Refuse NaN/Inf weights, and weights so large that scale_w would leave the record's
    plausible range, up front (``ModelError`` naming the caffemodel and the layer): found later
    they surface as NaN activations of another layer or as a bad record entry."""
    from amct_torch.caffe.graph import layer_modules

    from amct_torch.record.validate import SCALE_MAX

    for name, mod in layer_modules(model).items():
        for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
            if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
                raise ModelError("the weights hold NaN or Inf values", file=weights_file,
                                 layer=name)
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.is_floating_point() and w.numel():
            peak = float(w.detach().abs().max())
            if peak > 127 * SCALE_MAX:  # scale_w = peak/127 would break the record's rule
                raise ModelError(f"weights reach {peak:.3g}: beyond what int8 weights with a "
                                 f"plausible scale (at most {SCALE_MAX:g}) can represent",
                                 file=weights_file, layer=name)


def device_of(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (cpu when it has none)."""
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")
