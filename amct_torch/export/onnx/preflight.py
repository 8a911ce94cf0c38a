"""Checks, before calibration starts, that the ONNX models of a run can be written.

Why: whether a graph can be exported depends on the model, the quant config and the ONNX
options, all known once the model is loaded; a problem found after a long calibration wastes
the user's time. ``preflight_onnx`` builds both models in memory as the exporter will, with
placeholder factors (the QDQ model twice, offsets 0 and −128, so that both forms of a
conv + ReLU are covered), for the chosen runtime target, and runs ``onnx.checker`` and ONNX
Runtime on them. Cheap by design: weights are shape-only graph inputs and sizes come from the
shape rules (about 0.2 s plus one BN fusion on the nsfw ResNet-50). docs/export.md, "Preflight"."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
from torch import fx

from amct_torch.caffe.layers.traits import is_transposed, is_weighted
from amct_torch.errors import AmctError, ExportError
from amct_torch.export.layer_quant import LayerQuant
from amct_torch.export.onnx.targets import apply as apply_target
from amct_torch.export.onnx.targets import check_speed, get_target, symmetric_fix

log = logging.getLogger("amct_torch")

# the placeholder activation offsets: 0, and -128 (zero at the grid minimum, as after a
# ReLU), which choose between the QDQ and the integer form of a conv -> ReLU -> next layer;
# each QDQ model is built with one of them, so that both forms are checked
OFFSETS = (0, -128)


@dataclass
class PreflightResult:
    """What the preflight built: node counts of both models, how many layers the QDQ model
    quantizes, and how the models were checked (in words)."""

    float_nodes: int
    quant_nodes: int
    quantized: int
    checked_with: str


def _out_channels(mod: Any) -> int:
    if is_transposed(mod):
        return int(mod.weight.shape[1]) * int(getattr(mod, "groups", 1))
    return int(mod.weight.shape[0])


def _placeholder(name: str, mod: Any, channel_wise: bool, scale_d: float, offset_d: int) -> LayerQuant:
    """A LayerQuant with placeholder factors and zero int8 weights (a broadcast view: no copy)."""
    lq = LayerQuant(name=name, type=mod.caffe_type, module=mod, scale_d=scale_d, offset_d=offset_d)
    if not is_weighted(mod):
        lq.deq_scale = np.full(1, scale_d, np.float32)
        return lq
    c_out = _out_channels(mod)
    lq.per_channel = bool(channel_wise) and c_out > 1
    lq.scale_w = np.ones(c_out, np.float32)
    lq.int8_weight = np.broadcast_to(np.int8(0), tuple(mod.weight.shape))
    lq.deq_scale = np.full(c_out, scale_d, np.float32)
    if mod.bias is not None:
        lq.bias = mod.bias.detach().cpu().float().numpy()
        lq.bias_int32 = np.zeros(c_out, np.int32)
    return lq


def _joint_config(quant: Any) -> Any:
    """The activation config of a joint Eltwise group: IFMR defaults, asymmetric as the
    config's ``activation_offset`` (what the calibration step gives these groups; quant.cfg has
    no per-layer setting for an Eltwise)."""
    from amct_torch.config.types import LayerQuantConfig
    return LayerQuantConfig(asymmetric=bool(getattr(quant, "activation_offset", True)))


def _groups(gm: fx.GraphModule, quant: Any, file: Optional[str]) -> tuple[list, dict[str, Any], dict[str, Any]]:
    """The calibration groups of ``quant``'s enabled layers (as the calibration forms them),
    the graph's layer modules and the per-layer configs."""
    from amct_torch.caffe.graph import layer_modules
    from amct_torch.calibration.observer_plan import build_plan
    from amct_torch.config.types import LayerQuantConfig
    layers = getattr(quant, "layers", None)
    if layers is None:
        layers = {n: LayerQuantConfig() for n in quant}
    mods = layer_modules(gm)
    missing = sorted(n for n, lc in layers.items() if lc.quant_enable and n not in mods)
    if missing:
        raise ExportError(f"the quant config names layer(s) not in the model: {', '.join(missing)}", file=file)
    groups = build_plan(gm, layers, joint_quant=bool(getattr(quant, "joint_quant", False)),
                        joint_config=_joint_config(quant))
    return groups, mods, layers


def check_symmetric(gm: fx.GraphModule, quant: Any, target: str, file: Optional[str] = None) -> None:
    """Refuse, for a target that takes zero point 0 only (tensorrt), a calibration group whose
    activations the config makes asymmetric, naming its first layer and the config field: a
    quantized layer (its ``asymmetric``, default ``activation_offset``) or an Eltwise SUM that
    ``joint_quant`` quantizes (always as ``activation_offset``). ``quant``: a QuantConfig or a
    list of layer names (the default config: asymmetric)."""
    if quant is None or not get_target(target).symmetric:
        return
    groups, _, _ = _groups(gm, quant, file)
    for g in groups:
        if not g.config.asymmetric:
            continue
        if g.joint:
            what, fix = ("this Eltwise SUM, quantized by joint_quant,",
                         "an Eltwise SUM that joint_quant quantizes takes the config's activation_offset: set "
                         "activation_offset: false (or joint_quant: false) in the quant config")
        else:
            what, fix = "this layer", symmetric_fix("--config")
        raise ExportError(f"ONNX export for --onnx-target {target}: {what} would be calibrated with asymmetric "
                          f"activations, and {target} takes only zero point 0: {fix}", file=file, layer=g.layers[0])


def placeholder_plan(gm: fx.GraphModule, quant: Any, file: Optional[str] = None,
                     offset_d: int = 0) -> dict[str, LayerQuant]:
    """The exporter's per-layer plan with placeholder factors: every enabled layer of ``quant``
    (a QuantConfig: its channel_wise, and with joint_quant every Eltwise SUM) or of a list of
    layer names (the default config), in graph order. Layers calibrated together (one input,
    one config) share one factor and the others get distinct ones, as after calibration, so
    that the Q/DQ pairs are shared exactly as in the real model; every activation factor has
    offset ``offset_d``."""
    if quant is None:
        return {}
    groups, mods, layers = _groups(gm, quant, file)
    factor: dict[str, float] = {}
    for k, group in enumerate(groups):
        for name in group.layers:
            factor[name] = 1.0 + k / 1024.0  # distinct per group, exact in float32
    out: dict[str, LayerQuant] = {}
    for name, mod in mods.items():
        if name not in factor:
            continue
        if mod.caffe_type == "Eltwise":  # a joint group: activation factors only
            out[name] = LayerQuant(name=name, type="Eltwise", module=mod, scale_d=factor[name], offset_d=offset_d)
        else:
            out[name] = _placeholder(name, mod, layers[name].channel_wise, factor[name], offset_d)
    return out


def preflight_onnx(gm: fx.GraphModule, quant: Union[Any, Iterable[str], None] = None, *,
                   activations: str = "uint8", outputs: Optional[Sequence[str]] = None,
                   model_file: Optional[str] = None, speed: bool = False,
                   fuse: bool = True, target: str = "onnxruntime") -> PreflightResult:
    """Build the float and the QDQ ONNX models of ``gm`` as ``export_onnx`` will, with
    placeholder factors for the layers ``quant`` quantizes (a QuantConfig, a list of layer
    names, or None), and check them; raise an ``ExportError`` naming ``model_file`` (and the
    layer where there is one) for anything that would stop the export after calibration: a
    layer without an ONNX mapping, an ``outputs`` (``--onnx-outputs``) name that is not a blob,
    a quantized form ONNX cannot express, a model the checker or ONNX Runtime refuses.
    ``activations``: "uint8" or "int8" (``--onnx-activations``); ``speed``: the opt-in speed
    mode (``--onnx-quantize-eltwise``); ``fuse``: BN fusion first, as the config says (the
    graph the exporter receives is the fused one). ``target``: the runtime layout
    (``--onnx-target``; it fixes the activation type and the form, its rewrite is applied to
    the built model, and tensorrt refuses asymmetric groups, ``check_symmetric``). Nothing is
    written."""
    from amct_torch.export.onnx.qdq import _build
    from amct_torch.export.onnx.shapes import probe
    from amct_torch.export.onnx.validate import check_runtime, check_structure, runtime_status

    activations, integer_ops = get_target(target).layout(activations, True)
    # the form the exporter writes: the integer form unless the target or the speed mode says not
    integer_ops = integer_ops and not speed
    # only the integer form depends on where a zero point sits; a symmetric target has zero 0
    offsets = OFFSETS if integer_ops else (0,)
    try:
        check_speed(target, speed)
        graph = gm
        if fuse:
            from amct_torch.fusion import fuse_bn
            graph = fuse_bn(gm, do_fusion=bool(getattr(quant, "do_fusion", True)),
                            skip_fusion_layers=getattr(quant, "skip_fusion_layers", ()), file=model_file).graph
        # the fixed-size build: a symbolic spatial size only changes how sizes are written,
        # never whether a layer maps, and skips the spatial probe
        check_symmetric(graph, quant, target, model_file)
        pr = probe(graph, try_spatial=False)
        built = [_build(graph, {}, activations, model_file, "float", outputs=outputs,
                        dynamic_spatial=False, probed=pr, light=True)]
        for offset in offsets:
            plan = placeholder_plan(graph, quant, model_file, offset)
            out_f = elt = elt_f = None
            if speed and plan:
                from amct_torch.export.onnx.eltwise import calibrated_layers, eltwise_plan
                from amct_torch.export.onnx.residual import residual_layers
                res = residual_layers(graph, plan)
                elt = eltwise_plan(graph, plan, set(res))
                out_f = {n: (2.0, offset) for n in res}
                elt_f = {n: (3.0, offset) for n in calibrated_layers(elt)}
            model, b = _build(graph, plan, activations, model_file, "quant", out_factors=out_f,
                              eltwise=elt, elt_factors=elt_f, outputs=outputs, dynamic_spatial=False,
                              probed=pr, integer_ops=integer_ops, light=True)
            if plan and get_target(target).rewritten:  # the target's rewrite reads names, not weights
                check_structure(apply_target(target, model), model_file, b.layer_of,
                                f"the QDQ model for --onnx-target {target}")
            built.append((model, b))
            if not plan:
                break  # nothing quantized: the offset changes nothing
        for (model, b), what in zip(built, ("float", "QDQ", "QDQ")):
            check_runtime(model.SerializeToString(), model_file, b.layer_of, f"the {what} model")
    except AmctError as err:  # a mapping, a name, or a layer's own check while probing shapes
        msg = err.message if err.message.startswith("ONNX export") else f"ONNX export: {err.message}"
        raise ExportError(msg, file=model_file, layer=err.layer) from None
    return PreflightResult(len(built[0][0].graph.node), len(built[1][0].graph.node), len(plan),
                           runtime_status())


def onnx_preflight(gm: fx.GraphModule, model_file: str, outputs: Optional[Sequence[str]] = None,
                   config: Any = None, activations: str = "uint8", speed: bool = False,
                   target: str = "onnxruntime") -> Optional[ExportError]:
    """``preflight_onnx``'s problem returned instead of raised (None when the export will
    work), logged as a warning at once (``preflight_onnx`` raises instead: the one line)."""
    try:
        preflight_onnx(gm, config, activations=activations, outputs=outputs, model_file=model_file, speed=speed,
                       target=target)
    except ExportError as problem:
        log.warning("%s -- the ONNX models cannot be written", problem)
        return problem
    return None
