"""Graph → Caffe ``NetParameter`` with AMCT's Quant/DeQuant layers inserted.

Why not the layers' own ``bottom``/``top`` lists: after BN fusion the graph's edges are the
truth (absorbed layers are gone, their consumers now read the fused layer), so every layer's
bottoms are derived from the fx nodes it reads, and its tops keep their Caffe names unless that
would overwrite a value some later layer still needs. Both output models (fake-quant and
deploy) come from this one walk; only the blobs differ (see ``BlobFn``).

Insertion (docs/export.md, "Fake-quant Caffe model"): before each quantized layer a ``Quant``
layer (one per distinct input value and factor pair: layers reading the same fx node with the
same scale_d/offset_d share it), after it an in-place ``DeQuant`` layer named
``{layer}_dequant_layer``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np
import torch
from torch import fx

from amct_torch.caffe.graph import unique_name
from amct_torch.caffe.layers import CaffeLayer
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

    def attach_blobs(self) -> "EmittedNet":
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
             file: Optional[str] = None) -> EmittedNet:
    """The graph as a NetParameter (inputs as in ``gm.caffe_net``) with Quant/DeQuant around
    every layer of ``plan``. Blobs are returned as arrays (``EmittedNet.arrays``); call
    ``attach_blobs`` to put them into the message."""
    base = gm.caffe_net
    net = pb.NetParameter()
    net.CopyFrom(base)
    net.ClearField("layer")
    for layer in base.layer:
        if layer.type == "Input":
            net.layer.add().CopyFrom(layer)
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((pos[u] for u in n.users), default=-1) for n in nodes}
    outputs = _out_keys(gm)
    taken_layers = {l.name for l in base.layer}
    for n in nodes:
        if n.op == "call_module":
            taken_layers.add(getattr(gm.get_submodule(n.target), "caffe_name", ""))
    taken_blobs: set[str] = {b for l in base.layer for b in list(l.top) + list(l.bottom)}
    name_of: dict[fx.Node, str] = {}
    bound: dict[str, fx.Node] = {}

    def bind(value: fx.Node, desired: str, at: int) -> str:
        holder = bound.get(desired)
        if holder is not None and holder is not value and last_use[holder] > at:
            desired = unique_name(f"{desired}_{value.name}", taken_blobs)  # keep the live value intact
        taken_blobs.add(desired)
        bound[desired] = value
        name_of[value] = desired
        return desired

    for n in nodes:
        if n.op == "placeholder":
            bind(n, n.meta.get("caffe_blob", n.name), pos[n])
    quants: list[InsertedQuant] = []
    shared: dict[tuple, InsertedQuant] = {}
    dequants: dict[str, str] = {}
    arrays: dict[str, list[np.ndarray]] = {}
    for n in nodes:
        at = pos[n]
        if n.op in ("placeholder", "output"):
            continue
        if n.op == "call_function" and n.target is operator.getitem:
            continue  # named with its producer
        if n.op != "call_module" or not isinstance(gm.get_submodule(n.target), CaffeLayer):
            raise ExportError(f"graph node '{n.name}' ({n.op} {n.target}) is not a Caffe layer; "
                              "only graphs built by load_caffe (and fused) can be exported", file=file)
        mod: CaffeLayer = gm.get_submodule(n.target)
        lq = plan.get(mod.caffe_name)
        args = [a for a in n.args]
        if any(not isinstance(a, fx.Node) for a in args):
            raise ExportError("layer has a non-tensor input in the graph", file=file, layer=mod.caffe_name)
        bottoms = [name_of[a] for a in args]
        if lq is not None:
            for k in (range(len(args)) if lq.joint else (0,)):
                key = (args[k], float(lq.scale_d), int(lq.offset_d))
                q = shared.get(key)
                if q is None:
                    qname = unique_name(f"{mod.caffe_name}_quant_layer", taken_layers)
                    q = InsertedQuant(qname, bottoms[k], lq.scale_d, lq.offset_d)
                    shared[key] = q
                    quants.append(q)
                    ql = net.layer.add(name=qname, type="Quant")
                    ql.bottom.append(bottoms[k])
                    q.top = unique_name(qname, taken_blobs)
                    ql.top.append(q.top)
                    scale, offset = quant_param_values(lq.scale_d, lq.offset_d)
                    ql.quant_param.scale = scale
                    ql.quant_param.offset = offset
                if mod.caffe_name not in q.consumers:
                    q.consumers.append(mod.caffe_name)
                bottoms[k] = q.top
        layer = net.layer.add()
        layer.CopyFrom(mod.layer_param)
        for f in ("bottom", "top", "blobs"):
            layer.ClearField(f)
        layer.bottom.extend(bottoms)
        if mod.caffe_type in ("Convolution", "Deconvolution", "DepthwiseConvolution", "ConvolutionDepthwise"):
            layer.convolution_param.bias_term = getattr(mod, "bias", None) is not None
        elif mod.caffe_type == "InnerProduct":
            layer.inner_product_param.bias_term = getattr(mod, "bias", None) is not None
        if mod.num_tops == 1:
            values = [n]
        else:
            values = [None] * mod.num_tops
            for u in n.users:
                if u.op == "call_function" and u.target is operator.getitem:
                    values[int(u.args[1])] = u
        for k, v in enumerate(values):
            desired = mod.layer_param.top[k]
            if v is None:
                layer.top.append(unique_name(desired, taken_blobs))
                continue
            if mod.num_tops == 1 and v in outputs:
                desired = outputs[v]
            layer.top.append(bind(v, desired, at))
        arrays[layer.name] = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
                              for a in blobs(lq, mod)]
        if lq is not None and not lq.joint:
            dname = unique_name(f"{mod.caffe_name}_dequant_layer", taken_layers)
            dl = net.layer.add(name=dname, type="DeQuant")
            dl.bottom.append(layer.top[0])
            dl.top.append(layer.top[0])
            arrays[dname] = list(dequant_blobs(lq))
            dequants[mod.caffe_name] = dname
    return EmittedNet(net, quants, dequants, arrays)
