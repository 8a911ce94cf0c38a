"""Graph → Caffe ``NetParameter`` with AMCT's Quant/DeQuant layers inserted.

Why not the layers' own ``bottom``/``top`` lists: after BN fusion the graph's edges are the truth
(absorbed layers are gone), so every layer's bottoms come from the fx nodes it reads, and its
tops keep their Caffe names unless that would overwrite a value a later layer still needs. Both
output models come from this one walk; only the blobs differ (``BlobFn``). Before each quantized
layer a shared ``Quant`` layer (one per input value and factor pair), after it an in-place
``DeQuant`` named ``{layer}_dequant_layer`` (docs/export.md, "Fake-quant Caffe model")."""
from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
from torch import fx

from amct_torch.caffe.graph import unique_name
from amct_torch.caffe.layers import CaffeLayer
from amct_torch.caffe.layers.base import borrowing_blobs, node_layer
from amct_torch.caffe.layers.traits import weight_param
from amct_torch.caffe.netio import array_to_blob
from amct_torch.errors import ExportError
from amct_torch.export.layer_quant import LayerQuant
from amct_torch.proto import amct_caffe_pb2 as pb

#: (layer quant or None, module) -> the blobs to write for that layer
BlobFn = Callable[[Optional[LayerQuant], CaffeLayer], list[np.ndarray]]


@dataclass
class InsertedQuant:
    """One Quant layer written: its name, the blob it reads and the layers it feeds."""
    name: str
    bottom: str
    scale_d: float
    offset_d: int
    consumers: list[str] = field(default_factory=list)
    top: str = ""


@dataclass
class EmittedNet:
    net: pb.NetParameter
    quants: list[InsertedQuant]
    dequants: dict[str, str]  # quantized layer -> its DeQuant layer
    arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)  # layer -> blobs
    # layer -> a function making its blobs when asked (``emit_net(..., full=...)``)
    deferred: dict[str, Callable[[], list[np.ndarray]]] = field(default_factory=dict)

    def layer_blobs(self) -> Iterator[tuple[pb.LayerParameter, list[np.ndarray]]]:
        """Each layer of ``net`` with its blob arrays, a deferred layer's made only when its
        turn comes (what a layer-by-layer writer consumes)."""
        for layer in self.net.layer:
            make = self.deferred.get(layer.name)
            yield layer, (make() if make is not None else self.arrays.get(layer.name, []))

    def attach_blobs(self) -> EmittedNet:
        """Put ``arrays`` into the layers' BlobProtos (needed before writing a caffemodel)."""
        for layer in self.net.layer:
            if not layer.blobs:
                for arr in self.arrays.get(layer.name, []):
                    array_to_blob(arr, layer.blobs.add())
        return self


def quant_param_values(scale_d: float, offset_d: int) -> tuple[float, bytes]:
    """(quant_param.scale, quant_param.offset) of a Quant layer: float32(1/scale_d) and the offset as
    one byte (two's complement)."""
    inv = float(np.float32(1.0 / float(np.float32(scale_d))))
    return inv, bytes([int(offset_d) & 0xFF])


def _out_keys(gm: fx.GraphModule) -> dict[fx.Node, str]:
    out: dict[fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op == "output" and isinstance(node.args[0], dict):
            for k, v in node.args[0].items():
                if isinstance(v, fx.Node):
                    out.setdefault(v, k)
    return out


def emit_net(gm: fx.GraphModule, plan: Mapping[str, LayerQuant], blobs: BlobFn,
             dequant_blobs: Callable[[LayerQuant], list[np.ndarray]],
             file: Optional[str] = None, full: Optional[Mapping[str, LayerQuant]] = None) -> EmittedNet:
    """The graph as a NetParameter (inputs as in ``gm.caffe_net``) with Quant/DeQuant around
    every layer of ``plan``. Blobs are returned as arrays (``EmittedNet.arrays``); call
    ``attach_blobs`` to put them into the message. With ``full`` (a ``LazyPlan``; ``plan``
    then only needs the factors) no blob is made here: ``EmittedNet.deferred`` makes each
    layer's from ``full`` when ``layer_blobs`` reaches it."""
    base = gm.caffe_net
    out = EmittedNet(_net_with_inputs(base, gm.meta.get("caffe_data_layers", [])), [], {}, {})
    taken_layers = _layer_names(gm, base)
    names = _BlobNames(gm, base)
    quants = _QuantLayers(out, taken_layers, names.taken)
    for n in names.nodes:
        mod = _caffe_layer(gm, n, file)
        if mod is None:
            continue
        lq = plan.get(mod.caffe_name)
        bottoms = _bottoms(n, mod, names, file)
        if lq is not None:
            bottoms = quants.feed(n, bottoms, lq, mod.caffe_name)
        layer = _add_layer(out.net, mod, bottoms)
        _add_tops(layer, n, mod, names)
        if full is None:
            out.arrays[layer.name] = _numpy(blobs(lq, mod))
        else:
            out.deferred[layer.name] = _deferred(blobs, full, mod, lq is not None)
        if lq is not None and not lq.joint:
            if full is None:
                _add_dequant(out, layer, mod.caffe_name, dequant_blobs(lq), taken_layers)
            else:
                dname = _add_dequant(out, layer, mod.caffe_name, [], taken_layers)
                out.deferred[dname] = _deferred_dequant(dequant_blobs, full, mod.caffe_name)
    _add_head(out.net, gm, names)
    return out


def _add_head(net: pb.NetParameter, gm: fx.GraphModule, names: _BlobNames) -> None:
    """A train/test net's metric and loss layers after the inference part, as the user wrote
    them, each bottom read from the blob now holding that value (a graph output keeps its name)."""
    by_key = {key: names.name_of.get(node, key) for node, key in names.outputs.items()}
    for head in gm.meta.get("caffe_head", []):
        layer = net.layer.add()
        layer.CopyFrom(head)
        layer.ClearField("blobs")
        bottoms = [by_key.get(b, b) for b in layer.bottom]
        layer.ClearField("bottom")
        layer.bottom.extend(bottoms)


def _numpy(arrays: list) -> list[np.ndarray]:
    return [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in arrays]


def _deferred(blobs: BlobFn, full: Mapping[str, LayerQuant], mod: CaffeLayer,
              planned: bool) -> Callable[[], list[np.ndarray]]:
    def make() -> list[np.ndarray]:
        lq = full[mod.caffe_name] if planned else None
        with borrowing_blobs():  # consumed at once (written, or copied by the graph builder)
            return _numpy(blobs(lq, mod))
    return make


def _deferred_dequant(dequant_blobs: Callable[[LayerQuant], list[np.ndarray]],
                      full: Mapping[str, LayerQuant], name: str) -> Callable[[], list[np.ndarray]]:
    return lambda: list(dequant_blobs(full[name]))


def _net_with_inputs(base: pb.NetParameter, data_layers: Sequence[pb.LayerParameter] = ()) -> pb.NetParameter:
    """``base``'s net settings, Input layers and data layers (a train/test net's, written back
    as the user wrote them), no other layer."""
    net = pb.NetParameter()
    net.CopyFrom(base)
    net.ClearField("layer")
    data = {layer.name for layer in data_layers}
    for layer in base.layer:
        if layer.type == "Input" or layer.name in data:
            net.layer.add().CopyFrom(layer)
    return net


def _layer_names(gm: fx.GraphModule, base: pb.NetParameter) -> set[str]:
    """Layer names an inserted Quant/DeQuant layer must not take: the net's and the graph's."""
    taken = {layer.name for layer in base.layer}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            taken.add(getattr(gm.get_submodule(n.target), "caffe_name", ""))
    return taken


class _BlobNames:
    """The blob name of every fx value: its Caffe top name, unless a value some later layer
    still reads holds that name (then a new unique one); graph outputs keep their output key."""

    def __init__(self, gm: fx.GraphModule, base: pb.NetParameter) -> None:
        self.nodes = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.last_use = {n: max((self.pos[u] for u in n.users), default=-1) for n in self.nodes}
        self.outputs = _out_keys(gm)
        self.taken: set[str] = {b for layer in base.layer for b in list(layer.top) + list(layer.bottom)}
        self.name_of: dict[fx.Node, str] = {}
        self.bound: dict[str, fx.Node] = {}
        for n in self.nodes:
            if n.op == "placeholder":
                self.bind(n, n.meta.get("caffe_blob", n.name), self.pos[n])

    def bind(self, value: fx.Node, desired: str, at: int) -> str:
        """Name ``value`` (produced at node position ``at``) ``desired`` if that is free."""
        holder = self.bound.get(desired)
        if holder is not None and holder is not value and self.last_use[holder] > at:
            desired = unique_name(f"{desired}_{value.name}", self.taken)  # keep the live value intact
        self.taken.add(desired)
        self.bound[desired] = value
        self.name_of[value] = desired
        return desired


def _caffe_layer(gm: fx.GraphModule, n: fx.Node, file: Optional[str]) -> Optional[CaffeLayer]:
    """The Caffe layer node ``n`` runs; None for the nodes that write no layer (inputs, the
    output, a multi-top layer's getitem: named with its producer). Anything else is refused."""
    if n.op in ("placeholder", "output"):
        return None
    if n.op == "call_function" and n.target is operator.getitem:
        return None
    mod = node_layer(gm, n)
    if mod is None:
        raise ExportError(f"graph node '{n.name}' ({n.op} {n.target}) is not a Caffe layer; "
                          "only graphs built by load_caffe (and fused) can be exported", file=file)
    return mod


def _bottoms(n: fx.Node, mod: CaffeLayer, names: _BlobNames, file: Optional[str]) -> list[str]:
    """The blob names the layer of ``n`` reads."""
    args = [a for a in n.args if isinstance(a, fx.Node)]
    if len(args) != len(n.args):
        raise ExportError("layer has a non-tensor input in the graph", file=file, layer=mod.caffe_name)
    return [names.name_of[a] for a in args]


class _QuantLayers:
    """The Quant layers written so far: one per (input value, scale_d, offset_d)."""

    def __init__(self, out: EmittedNet, taken_layers: set[str], taken_blobs: set[str]) -> None:
        self.out, self.taken_layers, self.taken_blobs = out, taken_layers, taken_blobs
        self.shared: dict[tuple, InsertedQuant] = {}

    def feed(self, n: fx.Node, bottoms: list[str], lq: LayerQuant, layer: str) -> list[str]:
        """``bottoms`` with the quantized ones (the first, every one when joint) read through a
        Quant layer, written when no earlier layer made the same one."""
        bottoms = list(bottoms)
        for k in (range(len(n.args)) if lq.joint else (0,)):
            key = (n.args[k], float(lq.scale_d), int(lq.offset_d))
            q = self.shared.get(key)
            if q is None:
                q = self._write(f"{layer}_quant_layer", bottoms[k], lq)
                self.shared[key] = q
            if layer not in q.consumers:
                q.consumers.append(layer)
            bottoms[k] = q.top
        return bottoms

    def _write(self, base: str, bottom: str, lq: LayerQuant) -> InsertedQuant:
        qname = unique_name(base, self.taken_layers)
        q = InsertedQuant(qname, bottom, lq.scale_d, lq.offset_d)
        self.out.quants.append(q)
        ql = self.out.net.layer.add(name=qname, type="Quant")
        ql.bottom.append(bottom)
        q.top = unique_name(qname, self.taken_blobs)
        ql.top.append(q.top)
        ql.quant_param.scale, ql.quant_param.offset = quant_param_values(lq.scale_d, lq.offset_d)
        return q


def _add_layer(net: pb.NetParameter, mod: CaffeLayer, bottoms: list[str]) -> pb.LayerParameter:
    """A copy of the layer's parameters reading ``bottoms`` (tops and blobs cleared; the bias
    flag as the fused weights have it)."""
    layer = net.layer.add()
    layer.CopyFrom(mod.layer_param)
    for f in ("bottom", "top", "blobs"):
        layer.ClearField(f)
    layer.bottom.extend(bottoms)
    param = weight_param(mod)
    if param is not None:
        getattr(layer, param).bias_term = getattr(mod, "bias", None) is not None
    return layer


def _add_tops(layer: pb.LayerParameter, n: fx.Node, mod: CaffeLayer, names: _BlobNames) -> None:
    """The layer's tops: one per Caffe top, named by ``names`` (a top nothing reads gets a
    fresh unique name)."""
    if mod.num_tops == 1:
        values: list[Optional[fx.Node]] = [n]
    else:
        values = [None] * mod.num_tops
        for u in n.users:
            if u.op == "call_function" and u.target is operator.getitem:
                top = u.args[1]
                assert isinstance(top, int)  # the builder's getitem reads one top by its index
                values[top] = u
    for k, v in enumerate(values):
        desired = mod.layer_param.top[k]
        if v is None:
            layer.top.append(unique_name(desired, names.taken))
            continue
        if mod.num_tops == 1 and v in names.outputs:
            desired = names.outputs[v]
        layer.top.append(names.bind(v, desired, names.pos[n]))


def _add_dequant(out: EmittedNet, layer: pb.LayerParameter, name: str, arrays: list[np.ndarray],
                 taken_layers: set[str]) -> str:
    """The in-place DeQuant layer after quantized layer ``name``, with its blobs; its name."""
    dname = unique_name(f"{name}_dequant_layer", taken_layers)
    dl = out.net.layer.add(name=dname, type="DeQuant")
    dl.bottom.append(layer.top[0])
    dl.top.append(layer.top[0])
    out.arrays[dname] = list(arrays)
    out.dequants[name] = dname
    return dname
