"""The head of a train/test net: its metric and loss layers, run in torch after the inference
part, and the net's outputs as ``caffe test`` reports them.

The inference graph (``load_caffe``) stops at the blobs the metric/loss layers read; those
layers (``gm.meta["caffe_head"]``) run here on the graph's outputs and the data layers'
labels, never quantized, whichever model (float, fake-quant, deploy, ONNX Runtime) produced
the outputs. Caffe's net outputs are the blobs no layer consumes, in name order (Caffe keeps
them in a std::set); a loss top carries its loss weight.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from amct_torch.caffe.layers import layer_class
from amct_torch.caffe.layers.traits import is_net_head
from amct_torch.errors import AmctError, ModelError


@dataclass(frozen=True)
class NetOutput:
    """One of Caffe's net outputs: its blob name and loss weight (0 for a metric)."""

    name: str
    loss_weight: float


class NetHead:
    """The metric/loss layers of a net (``layers``: their LayerParameters in Caffe's order)."""

    def __init__(self, layers: Sequence[Any], file: Optional[str] = None) -> None:
        self.file = file
        self.modules: list[Any] = []
        for layer in layers:
            cls = layer_class(layer.type)
            if cls is None or not is_net_head(cls):
                raise ModelError(f"'{layer.type}' is not a metric or loss layer", file=file, layer=layer.name)
            self.modules.append(cls(layer, None, None, file=file))

    def __len__(self) -> int:
        return len(self.modules)

    def to(self, device: Any) -> NetHead:
        for m in self.modules:
            m.to(device)
        return self

    def run(self, blobs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every blob of ``blobs`` (the graph's outputs and the batch's data tops) and every
        head top, after running the head layers in Caffe's order."""
        values = dict(blobs)
        with torch.no_grad():
            for m in self.modules:
                bottoms = []
                for b in m.layer_param.bottom:
                    if b not in values:
                        raise ModelError(f"bottom '{b}' is neither a graph output nor a data top",
                                         file=self.file, layer=m.caffe_name)
                    bottoms.append(values[b])
                try:
                    out = m(*bottoms)
                except AmctError as err:
                    raise err.with_file(err.file or self.file) from None
                tops = out if isinstance(out, tuple) else (out,)
                for top, v in zip(m.layer_param.top, tops):
                    values[top] = v
        return values

    def tallies(self, ap_version: str = "Integral") -> dict[str, Any]:
        """Head top -> its tally, for the tops whose test figure is not a scalar's mean (the
        DetectionEvaluate rows' mAP, ``ap_version`` as the SSD fork's solver says)."""
        out: dict[str, Any] = {}
        for m in self.modules:
            tally = m.test_tally(ap_version)
            if tally is not None and len(m.layer_param.top):
                out[m.layer_param.top[0]] = tally
        return out

    def loss_weights(self) -> dict[str, float]:
        """Head top -> its loss weight."""
        out: dict[str, float] = {}
        for m in self.modules:
            for top, w in zip(m.layer_param.top, m.loss_weights()):
                out[top] = w
        return out


def net_outputs(gm: Any) -> list[NetOutput]:
    """Caffe's output blobs of the whole net a graph was built from (data layers, inference
    part, head): the blobs no layer consumes, sorted by name, with their loss weights."""
    net = gm.caffe_net
    available: set[str] = set(net.input)
    for layer in net.layer:
        for b in layer.bottom:
            available.discard(b)
        available.update(layer.top)
    weights = NetHead(gm.meta.get("caffe_head", [])).loss_weights()
    return [NetOutput(n, weights.get(n, 0.0)) for n in sorted(available)]
