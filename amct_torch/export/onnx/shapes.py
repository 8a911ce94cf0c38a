"""Shapes for the ONNX exporter: which dims of each value follow the batch size or the input's
spatial size (they become symbolic dims), and which part of the graph feeds the outputs a user
picked (``--onnx-outputs``).

Why probing: a Caffe net does not say which of its sizes are free. Propagating shapes at the
declared size, at batch 2 and at a larger spatial size shows which dims move with which input
dim; a net that cannot run at another spatial size keeps its declared one. The layers' own shape
rules (else a meta-device forward) give every size without computing a value; a layer whose
output size depends on values runs alone on zeros, else the whole net does."""
from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx

from amct_torch.errors import ExportError

SPATIAL_PROBE = 16  # pixels added to each spatial input dim for the spatial probe


@dataclass
class Probe:
    """``gm``: the graph on the CPU (itself when it is there already); ``shapes[node]``: the
    node's output shapes at the declared size (batch 1); ``batch[node]`` / ``varying[node]``:
    per output of the node, the set of dims that changed with the batch / in any probe;
    ``spatial``: True when the net also ran at the larger spatial size."""
    gm: fx.GraphModule
    batch: dict = field(default_factory=dict)
    varying: dict = field(default_factory=dict)
    spatial: bool = False
    shapes: dict = field(default_factory=dict)

    def out(self, node: fx.Node) -> list[tuple]:
        """The output shapes of ``node`` at the declared size."""
        return list(self.shapes.get(node, []))

    def dims(self, node: fx.Node, k: int = 0, spatial: bool = False) -> set:
        """The symbolic dims of output ``k`` of ``node``."""
        v = (self.varying if spatial else self.batch).get(node, [])
        return set(v[k]) if k < len(v) else set()


class _Recorder(fx.Interpreter):
    """Runs the graph and keeps each node's output shapes (ShapeProp prints a traceback for
    every failure, and a failing probe is expected here)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.seen: dict = {}

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.seen[n] = [tuple(out.shape)]
        elif isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
            self.seen[n] = [tuple(o.shape) for o in out]
        else:
            self.seen[n] = []
        return out


def _run(gm: fx.GraphModule, shapes: list[list[int]]) -> dict:
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*[torch.zeros(s) for s in shapes])
    return rec.seen


def _diff(base: dict, other: dict, into: dict) -> None:
    for node, shapes in base.items():
        dims = into.setdefault(node, [set() for _ in shapes])
        for k, (a, b) in enumerate(zip(shapes, other.get(node, []))):
            if a is None or b is None:
                continue
            if len(a) != len(b):
                dims[k].update(range(len(a)))
            else:
                dims[k].update(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


class _NeedsData(Exception):
    """A layer's output shape could not be found without running the whole net."""


def _meta(shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _module_shapes(mod: torch.nn.Module, ins: list) -> list:
    """Output tensors (meta) of ``mod`` for input tensors ``ins`` (meta): its shape rule, a
    meta forward, or (a data-dependent layer) a real run on zeros."""
    from amct_torch.caffe.layers import CaffeLayer
    shapes = [tuple(t.shape) for t in ins]
    inferred = mod.infer_shapes(shapes) if isinstance(mod, CaffeLayer) else None
    if inferred is not None:
        if any(s is None for s in inferred):
            raise _NeedsData()
        return [_meta(tuple(s)) for s in inferred]
    with torch.no_grad():
        if getattr(mod, "data_dependent", False):
            try:
                out = mod(*[torch.zeros(s, dtype=t.dtype) for s, t in zip(shapes, ins)])
            except Exception as err:  # zeros may not suit it: run the whole net
                raise _NeedsData() from err
        else:
            from torch.func import functional_call
            state = {k: v.to("meta") for k, v in list(mod.named_parameters()) + list(mod.named_buffers())}
            out = functional_call(mod, state, tuple(ins))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise _NeedsData()
    return [_meta(tuple(o.shape), o.dtype) for o in outs]


def _shape_run(gm: fx.GraphModule, shapes: list[list[int]]) -> dict:
    """``_run``'s result (node -> output shapes) from shape rules alone; raises ``_NeedsData``
    where values are needed, and the layer's own error where the shapes do not fit."""
    seen: dict = {}
    env: dict = {}
    inputs = iter(shapes)
    for n in gm.graph.nodes:
        out: Any  # a tensor, or a tuple of them (a multi-top layer)
        if n.op == "placeholder":
            out = _meta(tuple(next(inputs)))
        elif n.op == "call_module":
            ins = [env[a] for a in n.args]
            res = _module_shapes(gm.get_submodule(str(n.target)), ins)
            out = res[0] if len(res) == 1 and _single_top(gm, n) else tuple(res)
        elif n.op == "call_function" and n.target is operator.getitem:
            out = env[n.args[0]][n.args[1]]
        elif n.op == "output":
            continue
        else:
            raise _NeedsData()
        env[n] = out
        if isinstance(out, torch.Tensor):
            seen[n] = [tuple(out.shape)]
        else:
            seen[n] = [tuple(o.shape) for o in out]
    return seen


def _single_top(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True when the layer returns one tensor (one top), not a tuple."""
    mod = gm.get_submodule(str(node.target))
    tops = getattr(getattr(mod, "layer_param", None), "top", None)
    return tops is None or len(tops) == 1


def _on_cpu(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` itself when its tensors are on the CPU (nothing is written into it), else a CPU
    copy."""
    if all(t.device.type == "cpu" for t in list(gm.parameters()) + list(gm.buffers())):
        return gm
    return copy.deepcopy(gm).to("cpu")


def probe(gm: fx.GraphModule, try_spatial: bool = True) -> Probe:
    """Propagate shapes at the declared size, batch 2 and (if ``try_spatial``) a larger
    spatial size."""
    cpu = _on_cpu(gm)
    from amct_torch.caffe.graph import declared_inputs

    decl = [[1] + list(s[1:]) if s else [1] for _, s in declared_inputs(gm)]
    run = _shape_run
    try:
        base = _shape_run(cpu, decl)
    except _NeedsData:
        run = _run
        base = _run(cpu, decl)
    batch: dict = {}
    _diff(base, run(cpu, [[2] + s[1:] for s in decl]), batch)
    varying = {n: [set(d) for d in v] for n, v in batch.items()}
    spatial = False
    if try_spatial and all(len(s) == 4 for s in decl):
        big = [s[:2] + [s[2] + SPATIAL_PROBE, s[3] + SPATIAL_PROBE] for s in decl]
        try:
            other = run(cpu, big)
            spatial = True
        except Exception:  # noqa: BLE001 - a shape rule or any failure: a fixed spatial size
            spatial = False
        if spatial:
            _diff(base, other, varying)
    return Probe(cpu, batch, varying, spatial, base)


def blob_nodes(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """Blob name → the node holding its final value (the last writer, as Caffe's in-place
    layers rewrite a blob under the same name)."""
    from amct_torch.caffe.layers.base import node_layer

    out: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            out[node.meta.get("caffe_blob", node.name)] = node
        elif node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            tops = list(getattr(getattr(mod, "layer_param", None), "top", []))
            if len(tops) == 1:
                out[tops[0]] = node
        elif node.op == "call_function" and "caffe_top_index" in node.meta:
            producer = node.args[0]
            layer = node_layer(gm, producer) if isinstance(producer, fx.Node) else None
            assert layer is not None  # a top of a multi-top layer reads the layer's node
            out[layer.layer_param.top[node.meta["caffe_top_index"]]] = node
    return out


def pick_outputs(gm: fx.GraphModule, outputs: Optional[Sequence[str]],
                 file: Optional[str]) -> tuple[dict[str, fx.Node], set]:
    """The output blobs to write (all of the net's by default, else ``outputs`` by blob name)
    and the set of nodes they need."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if not outputs:
        chosen = dict(out_node.args[0])
    else:
        blobs = blob_nodes(gm)
        missing = [o for o in outputs if o not in blobs]
        if missing:
            raise ExportError(f"--onnx-outputs: no blob named {', '.join(map(repr, missing))} in the "
                              f"net (blobs: {', '.join(sorted(blobs))})", file=file)
        chosen = {o: blobs[o] for o in outputs}
        inputs = [o for o, n in chosen.items() if n.op == "placeholder"]
        if inputs:  # an output that is the input itself: a model that computes nothing
            raise ExportError(f"--onnx-outputs: {inputs[0]!r} is an input of the net, not a layer's "
                              "output; name blobs that layers compute", file=file)
    needed: set = set()
    stack = list(chosen.values())
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(a for a in n.all_input_nodes)
    return chosen, needed
