"""Build a torch.fx GraphModule from a parsed Caffe net: one submodule per Caffe layer.

The deploy prototxt's layer order is Caffe's execution order; blob names are resolved in that
order, so in-place layers (top == bottom) simply rebind the name. While building, the declared
input shapes are pushed through every layer on the meta device (no data, no cost) to catch
weights that do not fit their layer; the graph itself bakes in no shape, so fully
convolutional nets run at any input size.
"""
from __future__ import annotations

import keyword
import operator
import os
import re
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import fx, nn
from torch.func import functional_call

from amct_torch.caffe.layers import CaffeLayer, layer_class
from amct_torch.caffe.layers.base import layer_modules  # noqa: F401  (part of this module's API)
from amct_torch.errors import AmctError, ModelError


class CaffeGraphModule(fx.GraphModule):
    """A GraphModule that also carries the deploy NetParameter and the declared inputs.

    Both live in ``self.meta`` so that ``copy.deepcopy`` keeps them."""

    @property
    def caffe_net(self) -> Any:
        return self.meta.get("caffe_net")

    @caffe_net.setter
    def caffe_net(self, value: Any) -> None:
        self.meta["caffe_net"] = value

    @property
    def caffe_inputs(self) -> list[tuple[str, list[int]]]:
        return self.meta.get("caffe_inputs", [])

    @caffe_inputs.setter
    def caffe_inputs(self, value: list[tuple[str, list[int]]]) -> None:
        self.meta["caffe_inputs"] = value


_RESERVED = set(dir(fx.GraphModule)) | set(dir(nn.Module)) | {"meta", "graph", "code", "training"}


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3`` … — the first not in ``taken``, which it joins."""
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


def sanitize_name(name: str, taken: set[str]) -> str:
    """A valid, unused Python identifier for a Caffe name ('/', '-', '.' become '_')."""
    base = re.sub(r"\W", "_", name) or "_"
    if base[0].isdigit() or keyword.iskeyword(base) or base in _RESERVED or base.startswith("_"):
        base = "L_" + base
    return unique_name(base, taken)


def _meta_forward(module: CaffeLayer, args: Sequence[torch.Tensor]) -> Any:
    """Run ``module`` on meta tensors with meta copies of its parameters and buffers."""
    state = {k: v.to("meta") for k, v in list(module.named_parameters()) + list(module.named_buffers())}
    with torch.no_grad():
        return functional_call(module, state, tuple(args))


def _as_shapes(out: Any, n: int) -> list[Optional[tuple[int, ...]]]:
    if n == 0:
        return []
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != n:
        return [None] * n
    return [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]


def build_graph(parsed: Any, *, check_shapes: bool = True) -> CaffeGraphModule:
    """Build the graph of a ``ParsedNet`` (from ``amct_torch.caffe.netio.read_net``).

    ``parsed.blobs`` is None-free: a layer missing from it gets zero weights only when no
    weights file was given (``parsed.weights_file is None``); otherwise that is an error."""
    model_file = parsed.model_file
    weights_file = parsed.weights_file
    graph = fx.Graph()
    root = nn.Module()
    taken: set[str] = set()
    values: dict[str, fx.Node] = {}  # blob name -> node holding its current value
    shapes: dict[str, Optional[tuple[int, ...]]] = {}
    available: dict[str, None] = {}  # Caffe's available_blobs: produced and not yet consumed
    input_layer = {}
    for layer in parsed.net.layer:
        if layer.type == "Input":
            for top in layer.top:
                input_layer[top] = layer.name
    if not parsed.layers and not parsed.inputs:
        raise ModelError("the net has no layers", file=model_file)

    for name, shape in parsed.inputs:
        node = graph.placeholder(sanitize_name(name, taken))
        node.meta["caffe_layer"] = input_layer.get(name, name)
        node.meta["caffe_type"] = "Input"
        node.meta["caffe_blob"] = name
        values[name] = node
        shapes[name] = tuple(int(d) for d in shape) if shape else None
        available[name] = None

    producers = {}
    for i, layer in enumerate(parsed.layers):
        for top in layer.top:
            producers.setdefault(top, []).append(i)

    for i, layer in enumerate(parsed.layers):
        cls = layer_class(layer.type)
        if cls is None:
            raise ModelError(f"unknown layer type '{layer.type}'", file=model_file, layer=layer.name)
        for b in layer.bottom:
            if b not in values:
                later = [parsed.layers[j].name for j in producers.get(b, []) if j >= i]
                why = (f"; it is produced only by later layer '{later[0]}' (a cycle, or layers out of order)"
                       if later else "")
                raise ModelError(f"bottom blob '{b}' is not produced by any earlier layer or input{why}",
                                 file=model_file, layer=layer.name)
        bshapes = [shapes.get(b) for b in layer.bottom]
        known = all(s is not None for s in bshapes)
        blobs = parsed.blobs.get(layer.name)
        if blobs is None and weights_file is not None:
            blobs = []
        file = weights_file if weights_file is not None and blobs else model_file
        try:
            module = cls(layer, blobs, bshapes if known else None, file=file)
        except AmctError as err:
            if weights_file is not None and err.file in (model_file, weights_file):
                # issue 16: a blob problem names the caffemodel, a parameter problem the prototxt
                blob = "blob" in err.message or "caffemodel" in err.message
                err.with_file(weights_file if blob else model_file)
            raise
        except (ValueError, RuntimeError, TypeError, IndexError) as err:
            raise ModelError(f"cannot build {layer.type}: {err}", file=file, layer=layer.name) from None
        out_shapes: list[Optional[tuple[int, ...]]] = [None] * len(layer.top)
        inferred = module.infer_shapes(bshapes) if known and check_shapes else None
        if inferred is not None:
            out_shapes = list(inferred)
        elif check_shapes and known and not cls.data_dependent:
            metas = [torch.empty(s, device="meta") for s in bshapes]
            try:
                out_shapes = _as_shapes(_meta_forward(module, metas), len(layer.top))
            except AmctError:
                raise
            except Exception as err:  # noqa: BLE001 - any failure here means the shapes do not fit
                msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ModelError(f"{layer.type} does not fit its input shape(s) "
                                 f"{[list(s) for s in bshapes]}: {msg}", file=file, layer=layer.name) from None
        target = sanitize_name(layer.name, taken)
        root.add_module(target, module)
        node = graph.call_module(target, tuple(values[b] for b in layer.bottom))
        node.meta["caffe_layer"] = layer.name
        node.meta["caffe_type"] = layer.type
        for b in layer.bottom:
            available.pop(b, None)
        if len(layer.top) == 1:
            tops = [node]
        else:
            tops = []
            for k in range(len(layer.top)):
                g = graph.call_function(operator.getitem, (node, k))
                g.meta["caffe_layer"] = layer.name
                g.meta["caffe_type"] = layer.type
                g.meta["caffe_top_index"] = k
                tops.append(g)
        for k, top in enumerate(layer.top):
            values[top] = tops[k]
            shapes[top] = out_shapes[k]
            available.pop(top, None)
            available[top] = None

    if not available:
        raise ModelError("the net has no output blob", file=model_file)
    out = graph.output({name: values[name] for name in available})
    out.meta["caffe_layer"] = None
    out.meta["caffe_type"] = None
    _mark_inplace(graph, root)
    gm = CaffeGraphModule(root, graph, class_name="CaffeNet")
    gm.caffe_net = parsed.net
    gm.caffe_inputs = [(n, list(s)) for n, s in parsed.inputs]
    gm.eval()
    return gm


def _mark_inplace(graph: fx.Graph, root: nn.Module) -> None:
    """Let a layer overwrite its first bottom when that bottom is a tensor just made by a layer
    that returns fresh tensors and no other node (nor the graph output) reads it: the same
    buffer reuse Caffe does for in-place layers. Works in place only without autograd."""
    uses: dict[fx.Node, int] = {}
    for node in graph.nodes:
        fx.node.map_arg((node.args, node.kwargs), lambda a: uses.__setitem__(a, uses.get(a, 0) + 1))
    for node in graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        mod = root.get_submodule(node.target)
        if not isinstance(mod, CaffeLayer):
            continue
        mod.inplace = False
        src = node.args[0]
        if not (mod.can_run_inplace and isinstance(src, fx.Node)):
            continue
        if src.op != "call_module" or uses.get(src, 0) != 1:
            continue
        producer = root.get_submodule(src.target)
        mod.inplace = bool(getattr(producer, "fresh_output", False))


def set_inplace(gm: fx.GraphModule, enabled: bool) -> None:
    """Recompute the in-place buffer reuse from the current graph (``enabled``), or turn it off
    for every layer. Call it after editing the graph (fusion, inserted nodes), and turn it off
    when forward hooks keep references to intermediate outputs that a later in-place layer
    would overwrite (as with torchvision's ReLU(inplace=True))."""
    if enabled:
        _mark_inplace(gm.graph, gm)
    else:
        for mod in gm.modules():
            if isinstance(mod, CaffeLayer):
                mod.inplace = False


def load_caffe(model_file: str, weights_file: Optional[str] = None) -> CaffeGraphModule:
    """Load a Caffe deploy prototxt (and caffemodel) as a torch.fx GraphModule computing what
    Caffe computes at test time.

    ``forward(*inputs)`` takes the net inputs in Caffe's declared order and returns a dict from
    each output blob name (tops no later layer consumes) to its tensor. Without
    ``weights_file`` all parameters are zeros (BatchNorm variance 1, Scale 1). Every problem
    with the files raises ``ModelError`` naming the file and layer."""
    from amct_torch.caffe.netio import read_net
    parsed = read_net(os.fspath(model_file), None if weights_file is None else os.fspath(weights_file))
    gm = build_graph(parsed)
    from amct_torch.caffe.layers.quant import mark_integer_quants
    mark_integer_quants(gm)  # a deploy model runs with integer semantics (layers/integer.py)
    return gm
