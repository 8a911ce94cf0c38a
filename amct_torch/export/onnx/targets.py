"""The QDQ model's layout for the runtime that will run it (``--onnx-target``).

Why: every runtime turns QuantizeLinear/DequantizeLinear pairs into int8 kernels by its own
pattern rules, and a layout one runtime fuses another leaves in float. ``onnxruntime`` (the
default) is the model as ``export_onnx`` writes it; ``openvino`` gets plain QDQ, uint8
activations and a 1×1 strided convolution's stride moved into a ``Slice`` before its
quantizer; ``tensorrt`` gets plain QDQ with int8 zero point 0 (symmetric activations only,
refused before calibration otherwise), a residual Add reading its shortcut through the Q/DQ
that already quantizes it, and an FC's Q/DQ repeated after its Flatten. What each runtime does
and why: docs/export.md, "Runtime targets"."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amct_torch.errors import ConfigError, ExportError
from amct_torch.export.onnx.runtime_targets import TARGETS, Target, get_target

__all__ = ["TARGETS", "Target", "apply", "check_config", "check_options", "check_records", "check_speed",
           "get_target", "symmetric_fix"]


def symmetric_fix(source: str) -> str:
    """How to ask for symmetric activations, for an error message."""
    return (f"set activation_offset: false in the quant config ({source}), or pass "
            "--no-activation-offset / activation_offset=False without a config")


def check_speed(target: str, speed: bool, what: str = "--onnx-quantize-eltwise",
                error: Callable[[str], Exception] = ConfigError) -> None:
    """Refuse the speed mode for a target that takes zero point 0 only (tensorrt): its extra
    Q/DQ pairs get asymmetric min/max factors. ``what``: the option as the caller's user
    spells it; ``error``: the caller's error type (a ConfigError by default: the preflight turns
    it into an ExportError naming the model file)."""
    if speed and get_target(target).symmetric:
        raise error(f"--onnx-target {target} cannot take {what} (its extra factors are asymmetric); "
                    "drop one of the two options")


def check_options(target: str, activation_offset: bool, config: Optional[str], speed: bool = False) -> None:
    """Refuse, before any file is read, a target that cannot express the settings: TensorRT
    with asymmetric activations and no config file (the config, when given, decides and is
    checked by ``check_config`` once read), or with the speed mode (``check_speed``)."""
    check_speed(target, speed)
    if get_target(target).symmetric and config is None and activation_offset:
        raise ConfigError("--onnx-target tensorrt needs symmetric activations (TensorRT takes "
                          "only zero point 0): " + symmetric_fix("--config"))


def check_config(target: str, quant_config: Any, config_file: Optional[str]) -> None:
    """Refuse, before calibration, a quant config whose quantized layers a target cannot
    express: TensorRT and any layer with asymmetric activations (the config's
    ``activation_offset`` or a layer's ``asymmetric``), naming the first such layer."""
    if not get_target(target).symmetric:
        return
    bad = [n for n, c in quant_config.layers.items() if c.quant_enable and c.asymmetric]
    if bad:
        raise ConfigError(f"--onnx-target tensorrt needs symmetric activations (TensorRT takes only "
                          f"zero point 0), but layer '{bad[0]}'" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
                          + " is asymmetric: " + symmetric_fix(config_file or "--config")
                          + " (a JSON config: activation_quant_params.asymmetric false per layer)",
                          file=config_file)


def check_records(target: str, offsets: Iterable[tuple[str, int]], file: Optional[str]) -> None:
    """A record with a non-zero activation offset cannot be written for TensorRT."""
    if not get_target(target).symmetric:
        return
    for name, off in offsets:
        if int(off) != 0:
            raise ExportError(f"ONNX export for TensorRT: layer '{name}' has activation offset {off}; "
                              "TensorRT takes only zero point 0: calibrate with symmetric activations ("
                              + symmetric_fix("--config") + "; with joint_quant, activation_offset: false)",
                              file=file, layer=name)


def apply(target: str, model: onnx.ModelProto) -> onnx.ModelProto:
    """The built QDQ model rewritten in place for ``target`` (one that is not ``rewritten``:
    unchanged)."""
    for rewrite in _REWRITES.get(get_target(target).name, ()):
        rewrite(model)
    return model


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fresh(model: onnx.ModelProto, base: str) -> str:
    taken = {o for n in model.graph.node for o in list(n.output) + [n.name]} | \
            {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    out, k = base, 1
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    return out


def _subsample_strided_pointwise(model: onnx.ModelProto) -> None:
    """Conv(k=1×1, stride s, no padding) fed by Q→DQ of x becomes Q→DQ of Slice(x, steps s)
    → Conv(stride 1): the same products, with the subsampling where OpenVINO keeps the int8
    pattern intact (one Slice and pair per (x, factors, stride), shared by the convolutions)."""
    g = model.graph
    prod = {o: n for n in g.node for o in n.output}
    made: dict[tuple, str] = {}
    before: dict[int, list] = {}
    for n in g.node:
        if n.op_type != "Conv":
            continue
        a = _attrs(n)
        strides = list(a.get("strides", []))
        if list(a.get("kernel_shape", [])) != [1, 1] or not strides or strides == [1, 1] or any(a.get("pads", [])) \
                or any(d != 1 for d in a.get("dilations", [1, 1])):
            continue
        dq = prod.get(n.input[0])
        q = prod.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if dq is None or q is None or q.op_type != "QuantizeLinear":
            continue
        key = (q.input[0], tuple(q.input[1:]), tuple(strides))
        if key not in made:
            base = _fresh(model, f"{n.name}_subsample")
            consts = [numpy_helper.from_array(np.asarray(v, np.int64), f"{base}_{k}") for k, v in
                      (("starts", [0, 0]), ("ends", [np.iinfo(np.int64).max] * 2), ("axes", [2, 3]),
                       ("steps", strides))]
            g.initializer.extend(consts)
            sl = helper.make_node("Slice", [q.input[0]] + [c.name for c in consts], [base], name=base)
            q2 = helper.make_node("QuantizeLinear", [base] + list(q.input[1:]), [f"{base}_q"], name=f"{base}_q")
            d2 = helper.make_node("DequantizeLinear", [f"{base}_q"] + list(dq.input[1:]), [f"{base}_dq"],
                                  name=f"{base}_dq")
            before.setdefault(id(n), []).extend([sl, q2, d2])
            made[key] = d2.output[0]
        n.input[0] = made[key]
        for att in n.attribute:
            if att.name == "strides":
                att.ints[:] = [1, 1]
    if made:
        nodes = [m for n in g.node for m in before.get(id(n), []) + [n]]
        del g.node[:]
        g.node.extend(nodes)
        _drop_unused(model)


def _residual_through_qdq(model: onnx.ModelProto) -> None:
    """An Add input that is not dequantized but is quantized elsewhere (Q(x) → DQ) reads that
    DQ's output instead, so that TensorRT fuses the Add into the convolution on the other input
    with an int8 residual."""
    g = model.graph
    prod = {o: n for n in g.node for o in n.output}
    qdq: dict[str, str] = {}
    for n in g.node:  # x -> the output of the first DQ(Q(x)) pair
        if n.op_type == "DequantizeLinear" and n.input[0] in prod and prod[n.input[0]].op_type == "QuantizeLinear":
            qdq.setdefault(prod[n.input[0]].input[0], n.output[0])
    for n in g.node:
        if n.op_type != "Add" or len(n.input) != 2:
            continue
        feeds = [prod.get(i) for i in n.input]
        if not any(f is not None and f.op_type == "Conv" for f in feeds):
            continue  # only where TensorRT has a convolution to fuse the Add into
        for k, x in enumerate(n.input):
            f = feeds[k]
            if (f is None or f.op_type != "DequantizeLinear") and x in qdq:
                n.input[k] = qdq[x]


def _requantize_after_reshape(model: onnx.ModelProto) -> None:
    """Gemm ← Flatten/Reshape ← DQ(Q(x)): the same Q/DQ pair repeated after the reshape, so
    that the Gemm's input is dequantized directly (re-quantizing grid values with the same
    factors gives the same codes: no rounding is added)."""
    g = model.graph
    prod = {o: n for n in g.node for o in n.output}
    after: dict[int, list] = {}
    for n in g.node:
        if n.op_type != "Gemm":
            continue
        r = prod.get(n.input[0])
        dq = prod.get(r.input[0]) if r is not None and r.op_type in ("Flatten", "Reshape") else None
        if r is None or dq is None or dq.op_type != "DequantizeLinear" or prod.get(dq.input[0]) is None:
            continue
        q = prod[dq.input[0]]
        base = _fresh(model, f"{n.name}_input")
        q2 = helper.make_node("QuantizeLinear", [r.output[0]] + list(q.input[1:]), [f"{base}_q"], name=f"{base}_q")
        d2 = helper.make_node("DequantizeLinear", [f"{base}_q"] + list(dq.input[1:]), [f"{base}_dq"],
                              name=f"{base}_dq")
        after.setdefault(id(r), []).extend([q2, d2])
        n.input[0] = d2.output[0]
    if after:
        nodes = [m for n in g.node for m in [n] + after.get(id(n), [])]
        del g.node[:]
        g.node.extend(nodes)


def _read_names(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Every value name the nodes read, inside If/Loop subgraphs too (they read outer values by
    name, e.g. DetectionOutput's rows inside its If)."""
    out: set[str] = set()
    for n in nodes:
        out.update(n.input)
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                out |= _read_names(g.node) | {o.name for o in g.output}
    return out


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove the nodes and initializers no longer read (the Q/DQ pairs the rewired
    convolutions left)."""
    nodes = list(model.graph.node)
    outputs = {o.name for o in model.graph.output}
    while True:
        used = _read_names(nodes) | outputs
        keep = [n for n in nodes if any(o in used for o in n.output)]
        if len(keep) == len(nodes):
            break
        nodes = keep
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = _read_names(nodes)
    for t in [t for t in model.graph.initializer if t.name not in used]:
        model.graph.initializer.remove(t)


#: each rewritten target's rewrites of the built QDQ model, in order (the targets whose
#: ``rewritten`` field is set; tests/export checks the two agree)
_REWRITES: dict[str, tuple[Callable[[onnx.ModelProto], Any], ...]] = {
    "openvino": (_subsample_strided_pointwise,),
    "tensorrt": (_residual_through_qdq, _requantize_after_reshape),
}
