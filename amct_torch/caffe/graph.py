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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import fx, nn
from torch.func import functional_call

from amct_torch.arguments import bool_arg, checked, opt, path_arg
from amct_torch.caffe.fillers import fill_blobs, has_fillers
from amct_torch.caffe.layers import CaffeLayer, layer_class
from amct_torch.caffe.layers.base import layer_modules, node_layer  # noqa: F401  (layer_modules: part of this module's API)
from amct_torch.caffe.layers.conv import WeightedLayer
from amct_torch.caffe.layers.quant import DeQuantLayer
from amct_torch.caffe.layers.traits import is_net_head
from amct_torch.caffe.unknown_fields import refuse_unknown_fields
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
        return declared_inputs(self)

    @caffe_inputs.setter
    def caffe_inputs(self, value: list[tuple[str, list[int]]]) -> None:
        self.meta["caffe_inputs"] = value


def declared_inputs(gm: fx.GraphModule) -> list[tuple[str, list[int]]]:
    """The net's declared inputs (name, shape) that ``load_caffe`` keeps in the graph's meta."""
    return gm.meta.get("caffe_inputs", [])


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


@dataclass
class _Build:
    """What the builder knows while it walks the layers in Caffe's order."""
    parsed: Any
    check_shapes: bool
    graph: fx.Graph = field(default_factory=fx.Graph)
    root: nn.Module = field(default_factory=nn.Module)
    taken: set[str] = field(default_factory=set)
    values: dict[str, fx.Node] = field(default_factory=dict)  # blob name -> node of its value
    shapes: dict[str, Optional[tuple[int, ...]]] = field(default_factory=dict)
    available: dict[str, None] = field(default_factory=dict)  # Caffe's available_blobs (ordered)
    head: list[Any] = field(default_factory=list)  # the metric/loss layers, in Caffe's order
    head_reads: dict[str, fx.Node] = field(default_factory=dict)  # graph values the head reads
    head_tops: dict[str, str] = field(default_factory=dict)  # a head layer's top -> that layer
    data_tops: set[str] = field(default_factory=set)  # every data layer's top (labels too)

    @property
    def model_file(self) -> Optional[str]:
        return self.parsed.model_file

    @property
    def weights_file(self) -> Optional[str]:
        return self.parsed.weights_file


def build_graph(parsed: Any, *, check_shapes: bool = True,
                allow_unknown_fields: Optional[bool] = None) -> CaffeGraphModule:
    """Build the graph of a ``ParsedNet`` (from ``amct_torch.caffe.netio.read_net``).

    Without a weights file (``parsed.weights_file is None``) a layer missing from
    ``parsed.blobs`` gets zero weights; with one, a layer the caffemodel does not name gets its
    blobs from its deterministic fillers (``fillers.py``) or is an error. Phases: refuse what
    Caffe refuses about the net as a whole, declare the inputs, then per layer in Caffe's order
    make its module (blobs checked) and node (top shapes pushed through), and close with the
    output dict and the in-place flags. A prototxt field the schema does not know is refused
    unless ``allow_unknown_fields`` (None: the context's setting, ``unknown_fields.py``)."""
    refuse_unknown_fields(parsed.net, parsed.model_file, allow_unknown_fields)
    refuse_empty_net(parsed)
    check_unique_tops(parsed)
    build = _Build(parsed, check_shapes)
    add_inputs(build)
    producers = index_producers(parsed.layers)
    for i, layer in enumerate(parsed.layers):
        cls = layer_class_of(layer, build.model_file)
        if is_net_head(cls):
            add_head_layer(build, i, layer, producers)
            continue
        check_bottoms_exist(build, i, layer, producers)
        bshapes = known_bottom_shapes(build, layer)
        blobs = layer_blobs(build, layer, cls, bshapes)
        module = make_module(build, cls, layer, blobs, bshapes)
        out_shapes = top_shapes(build, cls, module, layer, bshapes)
        add_layer_node(build, layer, module, out_shapes)
    return finish_graph(build)


def refuse_empty_net(parsed: Any) -> None:
    """A net without layers and inputs is not a model."""
    if not parsed.layers and not parsed.inputs:
        raise ModelError("the net has no layers", file=parsed.model_file)


def check_unique_tops(parsed: Any) -> None:
    """Caffe's rule for tops (Net::AppendTop): a top may reuse a blob name only in place, i.e.
    when it is the layer's bottom at the same position; any other second producer of a name
    (a net input or an earlier layer's top) is refused, naming both layers."""
    producer: dict[str, str] = {}
    for name, _ in parsed.inputs:
        if name in producer:
            raise ModelError(f"net input '{name}' is declared twice", file=parsed.model_file)
        producer[name] = "the net input"
    for layer in parsed.layers:
        for k, top in enumerate(layer.top):
            in_place = k < len(layer.bottom) and layer.bottom[k] == top
            if in_place:
                continue
            if top in producer:
                first = producer[top]
                first = first if first == "the net input" else f"layer '{first}'"
                raise ModelError(f"top '{top}' is already produced by {first}; a layer may reuse a "
                                 f"blob name only in place (as its bottom at the same position), "
                                 f"Caffe refuses a blob with two producers",
                                 file=parsed.model_file, layer=layer.name)
            producer[top] = layer.name


def add_inputs(build: _Build) -> None:
    """One placeholder per declared input, in Caffe's order, with its declared shape; a data
    layer's top becomes one only when the inference part reads it (a label read only by the
    metric/loss layers is not a graph input)."""
    input_layer = {top: layer.name for layer in build.parsed.net.layer if layer.type == "Input"
                   for top in layer.top}
    data_layers = build.parsed.data_layers
    for layer in data_layers:
        for top in layer.top:
            input_layer[top] = layer.name
            build.data_tops.add(top)
    read = {b for layer in build.parsed.layers if not is_net_head(layer.type) for b in layer.bottom}
    for name, shape in build.parsed.inputs:
        if name in build.data_tops and name not in read:
            continue
        node = build.graph.placeholder(sanitize_name(name, build.taken))
        node.meta["caffe_layer"] = input_layer.get(name, name)
        node.meta["caffe_type"] = "Input"
        node.meta["caffe_blob"] = name
        build.shapes[name] = tuple(int(d) for d in shape) if shape else None
        node.meta["caffe_shape"] = build.shapes[name]
        build.values[name] = node
        build.available[name] = None


def add_head_layer(build: _Build, i: int, layer: Any, producers: dict[str, list[int]]) -> None:
    """A metric/loss layer: no graph node; the graph values it reads become graph outputs
    (named by their blob), data tops and earlier head tops are read from the batch and the
    head itself (caffe/head.py)."""
    _construct(build, layer_class_of(layer, build.model_file), layer, None, None)  # params checked
    for b in layer.bottom:
        if b in build.head_tops or (b in build.data_tops and b not in build.values):
            continue
        if b not in build.values:
            check_bottoms_exist(build, i, layer, producers)
        if build.values[b].op != "placeholder":  # a net input: the head reads it from the batch
            build.head_reads[b] = build.values[b]
    for top in layer.top:
        build.head_tops[top] = layer.name
    build.head.append(layer)


def refuse_reading_head(build: _Build, layer: Any) -> None:
    """Only metric/loss layers may read a metric/loss layer's top."""
    for b in layer.bottom:
        if b in build.head_tops:
            raise ModelError(f"reads '{b}', the top of {build.head_tops[b]!r}, a metric/loss layer; "
                             "only metric and loss layers may follow them",
                             file=build.model_file, layer=layer.name)


def index_producers(layers: Sequence[Any]) -> dict[str, list[int]]:
    """Blob name -> indices of the layers writing it (to explain a bottom read too early)."""
    producers: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        for top in layer.top:
            producers.setdefault(top, []).append(i)
    return producers


def layer_class_of(layer: Any, model_file: Optional[str]) -> type[CaffeLayer]:
    """The module class of the layer's type, or a ModelError naming an unknown type."""
    cls = layer_class(layer.type)
    if cls is None:
        raise ModelError(f"unknown layer type '{layer.type}'", file=model_file, layer=layer.name)
    return cls


def check_bottoms_exist(build: _Build, i: int, layer: Any, producers: dict[str, list[int]]) -> None:
    """Every bottom must be an input or a top of an earlier layer (Caffe's order)."""
    refuse_reading_head(build, layer)
    for b in layer.bottom:
        if b in build.values:
            continue
        later = [build.parsed.layers[j].name for j in producers.get(b, []) if j >= i]
        why = (f"; it is produced only by later layer '{later[0]}' (a cycle, or layers out of order)"
               if later else "")
        raise ModelError(f"bottom blob '{b}' is not produced by any earlier layer or input{why}",
                         file=build.model_file, layer=layer.name)


def known_bottom_shapes(build: _Build, layer: Any) -> Optional[list[tuple[int, ...]]]:
    """The bottoms' shapes when all are known (pushed through from the declared inputs)."""
    shapes = [build.shapes.get(b) for b in layer.bottom]
    known = [s for s in shapes if s is not None]
    return known if len(known) == len(shapes) else None


def layer_blobs(build: _Build, layer: Any, cls: type[CaffeLayer],
                bshapes: Optional[list[tuple[int, ...]]]) -> Optional[list[np.ndarray]]:
    """The layer's blobs: the caffemodel's (checked for integer data where float weights
    belong), its fillers' when the caffemodel does not name it (as Caffe builds it), or None
    (zeros) when no weights file was given."""
    blobs = build.parsed.blobs.get(layer.name)
    if build.weights_file is None:
        return blobs
    if blobs is not None:
        check_blob_types(layer, cls, blobs, build.weights_file)
        return blobs
    if bshapes is None or not has_fillers(layer):
        return []  # the layer's own blob-count check names what is missing
    shapes = [tuple(b.shape) for b in _construct(build, cls, layer, None, bshapes).caffe_blobs()]
    return fill_blobs(layer, shapes, build.weights_file) if shapes else []


_INTEGER_FIELDS = {np.dtype(np.int8): "int8_data", np.dtype(np.int32): "int32_data",
                   np.dtype(np.uint64): "uint64_data"}


def check_blob_types(layer: Any, cls: type[CaffeLayer], blobs: list[np.ndarray], weights_file: str) -> None:
    """Integer blobs belong to an AMCT deploy model only: int8 weights (+ int32 bias) of a
    Convolution/Deconvolution/InnerProduct, or the one uint64 blob of a DeQuant. Integer data
    anywhere else would be read as float weights (an int32 weight read as 1e6-sized floats)."""
    kinds = [np.asarray(b).dtype for b in blobs]
    if not any(k in _INTEGER_FIELDS for k in kinds):
        return
    weighted = issubclass(cls, WeightedLayer)
    if weighted and kinds[0] == np.int8 and all(k == np.int32 for k in kinds[1:]):
        return
    if issubclass(cls, DeQuantLayer) and kinds == [np.dtype(np.uint64)]:
        return
    i = next(i for i, k in enumerate(kinds) if k in _INTEGER_FIELDS)
    raise ModelError(f"blob {i} holds only integer data ({_INTEGER_FIELDS[kinds[i]]}) where float "
                     f"weights belong: this looks like an AMCT deploy model; give the float model "
                     f"(the caffemodel before quantization)", file=weights_file, layer=layer.name)


def _construct(build: _Build, cls: type[CaffeLayer], layer: Any, blobs: Optional[list[np.ndarray]],
               bshapes: Optional[list[tuple[int, ...]]]) -> CaffeLayer:
    """The module, every failure a ModelError: a blob problem names the caffemodel, a parameter
    problem the prototxt."""
    model_file, weights_file = build.model_file, build.weights_file
    file = weights_file if weights_file is not None and blobs else model_file
    try:
        return cls(layer, blobs, bshapes, file=file)
    except AmctError as err:
        if weights_file is not None and err.file in (model_file, weights_file):
            blob = "blob" in err.message or "caffemodel" in err.message
            err.with_file(weights_file if blob else model_file)
        raise
    except (ValueError, RuntimeError, TypeError, IndexError, OverflowError, MemoryError) as err:
        raise ModelError(f"cannot build {layer.type}: {err}", file=file, layer=layer.name) from None


def make_module(build: _Build, cls: type[CaffeLayer], layer: Any, blobs: Optional[list[np.ndarray]],
                bshapes: Optional[list[tuple[int, ...]]]) -> CaffeLayer:
    """The layer's module from its params and blobs (see ``_construct``)."""
    return _construct(build, cls, layer, blobs, bshapes)


def top_shapes(build: _Build, cls: type[CaffeLayer], module: CaffeLayer, layer: Any,
               bshapes: Optional[list[tuple[int, ...]]]) -> list[Optional[tuple[int, ...]]]:
    """The top shapes from the layer's shape rule, else from a forward on the meta device (no
    data, no cost); a layer whose inputs do not fit is a ModelError. Unknown: None."""
    unknown: list[Optional[tuple[int, ...]]] = [None] * len(layer.top)
    if bshapes is None or not build.check_shapes:
        return unknown
    file = build.weights_file if build.weights_file is not None and build.parsed.blobs.get(layer.name) \
        else build.model_file
    inferred = module.infer_shapes(bshapes)
    if inferred is not None:
        return list(inferred)
    if cls.data_dependent:
        return unknown
    metas = [torch.empty(s, device="meta") for s in bshapes]
    try:
        return _as_shapes(_meta_forward(module, metas), len(layer.top))
    except AmctError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure here means the shapes do not fit
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(f"{layer.type} does not fit its input shape(s) "
                         f"{[list(s) for s in bshapes]}: {msg}", file=file, layer=layer.name) from None


def add_layer_node(build: _Build, layer: Any, module: CaffeLayer,
                   out_shapes: list[Optional[tuple[int, ...]]]) -> None:
    """The layer's submodule and call node (getitem nodes for several tops); its tops rebind
    their blob names (in place included) and become available outputs."""
    target = sanitize_name(layer.name, build.taken)
    build.root.add_module(target, module)
    node = build.graph.call_module(target, tuple(build.values[b] for b in layer.bottom))
    node.meta["caffe_layer"] = layer.name
    node.meta["caffe_type"] = layer.type
    for b in layer.bottom:  # read by Silence/metric/loss only, a layer's top stays an output
        if not module.keeps_outputs or build.values[b].op == "placeholder":
            build.available.pop(b, None)
    if len(layer.top) == 1:
        tops = [node]
        node.meta["caffe_shape"] = out_shapes[0]
    else:
        node.meta["caffe_shape"] = None
        tops = []
        for k in range(len(layer.top)):
            g = build.graph.call_function(operator.getitem, (node, k))
            g.meta["caffe_layer"] = layer.name
            g.meta["caffe_type"] = layer.type
            g.meta["caffe_top_index"] = k
            g.meta["caffe_shape"] = out_shapes[k]
            tops.append(g)
    for k, top in enumerate(layer.top):
        build.values[top] = tops[k]
        build.shapes[top] = out_shapes[k]
        build.available.pop(top, None)
        build.available[top] = None


def finish_graph(build: _Build) -> CaffeGraphModule:
    """The output dict (tops no layer consumes, those read only by Silence/metric/loss layers
    included; a net input is never an output), the in-place flags and the GraphModule."""
    outputs = {name: build.values[name] for name in build.available}
    for name, node in build.head_reads.items():
        if outputs.setdefault(name, node) is not node:
            raise ModelError(f"blob '{name}' is read by a metric/loss layer and later changed in "
                             "place by another layer; give the changed value its own top name",
                             file=build.model_file, layer=build.values[name].meta.get("caffe_layer"))
    if not outputs:
        raise ModelError("the net has no output blob", file=build.model_file)
    out = build.graph.output(outputs)
    out.meta["caffe_layer"] = None
    out.meta["caffe_type"] = None
    _mark_inplace(build.graph, build.root)
    gm = CaffeGraphModule(build.root, build.graph, class_name="CaffeNet")
    gm.caffe_net = build.parsed.net
    gm.caffe_inputs = [(n, list(s)) for n, s in build.parsed.inputs
                       if n not in build.data_tops or n in build.values]
    gm.meta["caffe_data_layers"] = list(build.parsed.data_layers)
    gm.meta["caffe_head"] = list(build.head)
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
        mod = node_layer(root, node) if node.args else None
        if mod is None:
            continue
        mod.inplace = False
        src = node.args[0]
        if not (mod.can_run_inplace and isinstance(src, fx.Node)):
            continue
        if src.op != "call_module" or uses.get(src, 0) != 1:
            continue
        producer = root.get_submodule(str(src.target))
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


@checked(model_file=path_arg, weights_file=opt(path_arg), allow_unknown_fields=opt(bool_arg))
def load_caffe(model_file: str, weights_file: Optional[str] = None, *,
               allow_unknown_fields: Optional[bool] = None) -> CaffeGraphModule:
    """Load a Caffe deploy prototxt (and caffemodel) as a torch.fx GraphModule computing what
    Caffe computes at test time.

    A prototxt field the schema does not know (a Caffe fork's parameter) is a ModelError
    unless ``allow_unknown_fields`` is True (None: the context's setting, see
    ``amct_torch.caffe.unknown_fields``); allowed, the layer runs without it.
    ``forward(*inputs)`` takes the net inputs in Caffe's declared order and returns a dict from
    each output blob name (tops no later layer consumes) to its tensor. Without
    ``weights_file`` all parameters are zeros (BatchNorm variance 1, Scale 1). Every problem
    with the files raises ``ModelError`` naming the file and layer."""
    from amct_torch.caffe import read_ahead
    from amct_torch.caffe.netio import read_net
    parsed = read_ahead.take(model_file, weights_file)
    if parsed is None:
        parsed = read_net(os.fspath(model_file), None if weights_file is None else os.fspath(weights_file))
    from amct_torch.caffe.layers.base import taking_blobs
    with taking_blobs():  # the arrays were read for this graph alone
        gm = build_graph(parsed, allow_unknown_fields=allow_unknown_fields)
    del parsed
    from amct_torch.caffe.layers.quant import mark_integer_quants
    mark_integer_quants(gm)  # a deploy model runs with integer semantics (layers/integer.py)
    return gm
