"""Shapes for the ONNX exporter: which dims of each value follow the batch size or the input's
spatial size (they become symbolic dims), and which part of the graph feeds the outputs a user
picked (``--onnx-outputs``).

Why probing: a Caffe net does not say which of its sizes are free. Running the graph (shape
propagation, on zeros, CPU) at the declared size, at batch 2, and at a larger spatial size
shows which dims move with which input dim; a net that cannot run at another spatial size (an
InnerProduct, a Reshape to constants) keeps its declared spatial size.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import fx

from amct_torch.errors import ExportError

SPATIAL_PROBE = 16  # pixels added to each spatial input dim for the spatial probe


@dataclass
class Probe:
    """``gm``: a CPU copy whose nodes carry ``tensor_meta`` at the declared size (batch 1);
    ``batch[node]`` / ``varying[node]``: per output of the node, the set of dims that changed
    with the batch / in any probe; ``spatial``: True when the net also ran at the larger
    spatial size."""
    gm: fx.GraphModule
    batch: dict = field(default_factory=dict)
    varying: dict = field(default_factory=dict)
    spatial: bool = False

    def dims(self, node: fx.Node, k: int = 0, spatial: bool = False) -> set:
        """The symbolic dims of output ``k`` of ``node``."""
        v = (self.varying if spatial else self.batch).get(node, [])
        return set(v[k]) if k < len(v) else set()


def _shapes(node: fx.Node) -> list[Optional[tuple]]:
    tm = node.meta.get("tensor_meta")
    if tm is None or isinstance(tm, dict):
        return []
    if hasattr(tm, "shape"):  # one TensorMetadata (itself a NamedTuple)
        return [tuple(tm.shape)]
    return [tuple(t.shape) if hasattr(t, "shape") else None for t in tm]


class _Recorder(fx.Interpreter):
    """Runs the graph and keeps each node's output shapes (ShapeProp prints a traceback for
    every failure, and a failing probe is expected here)."""

    def __init__(self, gm: fx.GraphModule, keep_meta: bool) -> None:
        super().__init__(gm)
        self.seen: dict = {}
        self.keep_meta = keep_meta

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.seen[n] = [tuple(out.shape)]
            meta = out
        elif isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
            self.seen[n] = [tuple(o.shape) for o in out]
            meta = out
        else:
            self.seen[n], meta = [], None
        if self.keep_meta:
            if meta is None:
                n.meta.pop("tensor_meta", None)
            else:
                n.meta["tensor_meta"] = _extract(meta)
        return out


def _extract(t):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata
    if isinstance(t, torch.Tensor):
        return _extract_tensor_metadata(t)
    return tuple(_extract_tensor_metadata(o) for o in t)


def _run(gm: fx.GraphModule, shapes: list[list[int]], keep_meta: bool = False) -> dict:
    rec = _Recorder(gm, keep_meta)
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


def probe(gm: fx.GraphModule, try_spatial: bool = True) -> Probe:
    """Propagate shapes at the declared size, batch 2 and (if ``try_spatial``) a larger
    spatial size; the returned copy holds the declared size's ``tensor_meta``."""
    cpu = copy.deepcopy(gm).to("cpu")
    decl = [[1] + list(s[1:]) if s else [1] for _, s in gm.caffe_inputs]
    batch: dict = {}
    base = _run(cpu, decl, keep_meta=True)  # the declared size's tensor_meta stays on the nodes
    _diff(base, _run(cpu, [[2] + s[1:] for s in decl]), batch)
    varying = {n: [set(d) for d in v] for n, v in batch.items()}
    spatial = False
    if try_spatial and all(len(s) == 4 for s in decl):
        big = [s[:2] + [s[2] + SPATIAL_PROBE, s[3] + SPATIAL_PROBE] for s in decl]
        try:
            other = _run(cpu, big)
            spatial = True
        except Exception:  # noqa: BLE001 - any failure: the net has a fixed spatial size
            spatial = False
        if spatial:
            _diff(base, other, varying)
    return Probe(cpu, batch, varying, spatial)


def blob_nodes(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """Blob name → the node holding its final value (the last writer, as Caffe's in-place
    layers rewrite a blob under the same name)."""
    out: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            out[node.meta.get("caffe_blob", node.name)] = node
        elif node.op == "call_module":
            mod = gm.get_submodule(node.target)
            tops = list(getattr(getattr(mod, "layer_param", None), "top", []))
            if len(tops) == 1:
                out[tops[0]] = node
        elif node.op == "call_function" and "caffe_top_index" in node.meta:
            mod = gm.get_submodule(node.args[0].target)
            out[mod.layer_param.top[node.meta["caffe_top_index"]]] = node
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
    needed: set = set()
    stack = list(chosen.values())
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(a for a in n.all_input_nodes)
    return chosen, needed
