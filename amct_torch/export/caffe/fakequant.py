"""The fake-quant Caffe model (docs/export.md) and the torch model built from it.

The fake-quant net is the (fused) float net with a ``Quant`` layer before each quantized layer
(computes the fake quantization), fake-quantized weights (ARQ grid with the record's scale_w) in the layer,
and an in-place ``DeQuant`` layer after it (identity in float; blobs deq_scale = scale_d·scale_w
per output channel, shift_bit 0, offset_w 0). ``fake_quant_graph`` builds the torch model from
that same NetParameter with the loader's graph builder, so torch, the written files and
OpenCV run one definition of the model.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np
import torch

from amct_torch.arguments import checked, graph_module, instance, opt, path_arg
from amct_torch.caffe.data_layers import is_data_layer
from amct_torch.caffe.graph import CaffeGraphModule, build_graph, layer_modules
from amct_torch.caffe.layers import CaffeLayer, QuantLayer
from amct_torch.caffe.layers.base import taking_blobs
from amct_torch.caffe.netio import ParsedNet
from amct_torch.export.caffe import SUFFIXES
from amct_torch.export.caffe.netbuild import EmittedNet, emit_net
from amct_torch.export.caffe.text import write_caffe_layers
from amct_torch.export.layer_quant import LayerQuant, LazyPlan, plan_layers
from amct_torch.record import LayerRecord


def _fake_blobs(lq: Optional[LayerQuant], mod: CaffeLayer) -> list[np.ndarray]:
    blobs = [np.asarray(b, np.float32) for b in mod.caffe_blobs()]
    if lq is not None and lq.weighted:
        assert lq.fake_weight is not None  # a weighted layer's plan has its weights
        blobs[0] = lq.fake_weight.reshape(blobs[0].shape)
    return blobs


def _fake_dequant_blobs(lq: LayerQuant) -> list[np.ndarray]:
    assert lq.deq_scale is not None  # only quantized layers get a DeQuant
    c = lq.deq_scale.size
    return [lq.deq_scale.astype(np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32)]


def fake_quant_net(gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord],
                   file: Optional[str] = None) -> EmittedNet:
    """The fake-quant NetParameter (with blobs) of a (fused) graph and its record."""
    plan = plan_layers(gm, records, file)
    return emit_net(gm, plan, _fake_blobs, _fake_dequant_blobs, file)


class _LayerByLayer(Mapping[str, list[np.ndarray]]):
    """An emitted net's float blobs by layer name, each layer's made when the graph builder
    asks for it (the last one kept: the builder asks twice), so that the whole net's
    fake-quant weights never exist at once beside the graph being built."""

    def __init__(self, emitted: EmittedNet) -> None:
        self.emitted = emitted
        self.names = [l.name for l in emitted.net.layer
                      if l.name in emitted.deferred or emitted.arrays.get(l.name)]
        self._last: tuple[Optional[str], Optional[list[np.ndarray]]] = (None, None)

    def __getitem__(self, name: str) -> list[np.ndarray]:
        if self._last[0] != name:
            self._last = (None, None)
            make = self.emitted.deferred.get(name)
            arrays = make() if make is not None else self.emitted.arrays.get(name)
            if not arrays:
                raise KeyError(name)
            self._last = (name, [np.asarray(a, np.float32) for a in arrays])
        assert self._last[1] is not None
        return self._last[1]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def graph_from_net(net, inputs, blobs: Mapping[str, list[np.ndarray]],
                   model_file: Optional[str] = None) -> CaffeGraphModule:
    """Build a graph from an in-memory NetParameter and its float blobs by layer name (a
    dict, or a mapping that makes each layer's blobs when asked: ``_LayerByLayer``)."""
    if not isinstance(blobs, _LayerByLayer):
        blobs = {k: [np.asarray(a, np.float32) for a in v] for k, v in blobs.items() if v}
    clean = type(net)()
    clean.CopyFrom(net)
    for l in clean.layer:
        l.ClearField("blobs")
    data = [l for l in clean.layer if is_data_layer(l.type)]
    parsed = ParsedNet(net=clean, inputs=[(n, list(s)) for n, s in inputs],
                       layers=[l for l in clean.layer if l.type != "Input" and not is_data_layer(l.type)],
                       data_layers=data,
                       blobs=blobs,  # type: ignore[arg-type]  # the builder only reads it
                       model_file=model_file, weights_file=None)
    if isinstance(blobs, _LayerByLayer):
        # the fresh fake-quant weights become the graph's own; the borrowed (read-only)
        # views of the source graph's tensors are copied
        with taking_blobs():  # unknown fields: those of the user's graph, checked at its load
            return build_graph(parsed, allow_unknown_fields=True)
    return build_graph(parsed, allow_unknown_fields=True)


@checked(fused_gm=graph_module, records=instance(Mapping, what="a mapping of layer name to LayerRecord"),
         file=opt(path_arg))
def fake_quant_graph(fused_gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord],
                     file: Optional[str] = None) -> CaffeGraphModule:
    """The torch fake-quant model: the fake-quant NetParameter built with ``build_graph``.

    Each Quant module keeps the record's exact scale_d (the file holds float32(1/scale_d),
    whose inverse can differ in the last bit), so the model computes the fake quantization exactly:
    q = clamp(round(x/scale_d) + offset_d, −128, 127), y = (q − offset_d)·scale_d.
    The result is on the device of ``fused_gm``'s first parameter."""
    plan = LazyPlan(fused_gm, records, file)  # one layer's fake-quant weights at a time
    emitted = emit_net(fused_gm, plan.light, _fake_blobs, _fake_dequant_blobs, file, full=plan)
    gm = graph_from_net(emitted.net, fused_gm.caffe_inputs, _LayerByLayer(emitted), file)
    exact = {q.name: (q.scale_d, q.offset_d) for q in emitted.quants}
    for name, mod in layer_modules(gm).items():
        if isinstance(mod, QuantLayer) and name in exact:
            mod.set_exact_scale(*exact[name])
    gm.meta["quant_layers"] = [q.name for q in emitted.quants]
    try:
        device = next(fused_gm.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    return gm.to(device)


def save_fake_quant(gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord], save_path: str,
                    offset_form: str = "uint8", file: Optional[str] = None) -> EmittedNet:
    """Write ``{save_path}_fake_quant_model.prototxt`` and ``_fake_quant_weights.caffemodel``."""
    plan = LazyPlan(gm, records, file, rows=True)  # every check now; each layer's weights as written
    emitted = emit_net(gm, plan.light, _fake_blobs, _fake_dequant_blobs, file, full=plan)
    write_caffe_layers(emitted, save_path + SUFFIXES["fake_quant_model"],
                       save_path + SUFFIXES["fake_quant_weights"], offset_form)
    return emitted
