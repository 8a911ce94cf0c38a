"""Empirical bias correction of the quantized layers (opt-in, beyond AMCT).

Why: rounding the weights and fake-quantizing the inputs shifts each quantized layer's output by
a per-channel mean error, a large share of the error on a ReLU network; adding it to the layer's
float bias removes it without touching the int8 grid, and every exporter writes the corrected
bias. The correction is sequential: a forward hook on each corrected layer, in graph order,
measures its output mean on the fake-quant model and corrects both its bias and the output it
hands on, so downstream layers see their upstream layers already corrected (correcting all at
once compounds the errors on a residual net). Layers: Convolution, Deconvolution and
InnerProduct entries that have a bias. docs/algorithms.md, "Improvements beyond AMCT"."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Union

import torch
from torch import fx, nn

from amct_torch.caffe.layers.traits import is_weighted
from amct_torch.record.types import LayerRecord

if TYPE_CHECKING:
    from amct_torch.caffe.layers.base import CaffeLayer

log = logging.getLogger("amct_torch.calibration")



def correctable_layers(gm: fx.GraphModule, records: Mapping[str, LayerRecord]) -> list[str]:
    """Record layers of ``gm`` whose bias can absorb a correction, in graph order."""
    from amct_torch.caffe.graph import layer_modules

    return [name for name, mod in layer_modules(gm).items()
            if name in records and is_weighted(mod)
            and getattr(mod, "bias", None) is not None]


class _ChannelMeans:
    """Forward hooks accumulating each layer output's per-channel sum (axis 1) and count."""

    def __init__(self, mods: Mapping[str, nn.Module]) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in mods.items()]

    def _hook(self, name: str):
        def hook(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
            y = out.detach().double()
            dims = [0] + list(range(2, y.dim()))
            s = y.sum(dim=dims)
            self.sums[name] = self.sums.get(name, 0) + s
            self.counts[name] = self.counts.get(name, 0) + y.numel() // y.shape[1]
        return hook

    def means(self) -> dict[str, torch.Tensor]:
        return {n: self.sums[n] / self.counts[n] for n in self.sums}

    def close(self) -> None:
        for h in self.handles:
            h.remove()


Batch = Union[torch.Tensor, tuple]


def _run(model: nn.Module, batches: Iterable[Batch], device: torch.device) -> None:
    with torch.no_grad():
        for b in batches:
            if isinstance(b, tuple):
                model(*(t.to(device) for t in b))
            else:
                model(b.to(device))


def _concat(batches: Sequence[Batch], max_samples: int) -> Batch:
    """The first ``max_samples`` samples of ``batches`` as one batch (tuples element-wise)."""
    if isinstance(batches[0], tuple):
        return tuple(torch.cat([torch.as_tensor(b[i]) for b in batches])[:max_samples]
                     for i in range(len(batches[0])))
    return torch.cat([torch.as_tensor(b) for b in batches])[:max_samples]


def _sequential_hook(name: str, target: torch.Tensor, total: dict[str, torch.Tensor]):
    """Forward hook: correct this layer's bias by target − its output mean, and hand on the
    corrected output (so that downstream layers see it)."""
    def hook(mod: CaffeLayer, _a: tuple, out: torch.Tensor) -> torch.Tensor:
        y = out.detach()
        dims = [0] + list(range(2, y.dim()))
        delta = target.to(y.device) - y.double().mean(dim=dims)
        total[name] = delta
        bias = mod.bias
        assert bias is not None  # one of the correctable_layers
        bias.data += delta.to(bias.dtype)
        return out + delta.to(out.dtype).reshape([1, -1] + [1] * (y.dim() - 2))
    return hook


def correct_biases(fused: fx.GraphModule, records: Mapping[str, LayerRecord],
                   batches: Sequence[Batch], device: torch.device, max_samples: int = 256
                   ) -> dict[str, torch.Tensor]:
    """Fold the sequential empirical bias correction into the biases of ``fused`` (in place)
    and return ``{layer: correction per output channel}`` (float64).

    ``batches``: the calibration batches (tensors N×…, or tuples of them for several inputs);
    ``records``: the calibrated record (scale_d/offset_d and scale_w present). The float means
    and the fake-quant pass use the same first ``max_samples`` samples (float: in batches of the
    original size; fake-quant: as one batch)."""
    from amct_torch.caffe.graph import layer_modules
    from amct_torch.export import fake_quant_graph

    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    names = correctable_layers(fused, records)
    if not names:
        return {}
    if not batches:
        raise ValueError("bias correction needs at least one calibration batch")
    data = _concat(list(batches), max_samples)
    count = len(data[0]) if isinstance(data, tuple) else len(data)
    step = len(batches[0][0]) if isinstance(batches[0], tuple) else len(batches[0])
    chunks = [tuple(t[i:i + step] for t in data) if isinstance(data, tuple) else data[i:i + step]
              for i in range(0, count, max(1, step))]
    fmods = layer_modules(fused)
    ref = _ChannelMeans({n: fmods[n] for n in names})
    try:
        _run(fused, chunks, device)
    finally:
        ref.close()
    target = ref.means()
    quant = fake_quant_graph(fused, records).to(device)
    qmods = layer_modules(quant)
    total: dict[str, torch.Tensor] = {}
    handles = [qmods[n].register_forward_hook(_sequential_hook(n, target[n], total)) for n in names]
    try:
        _run(quant, [data], device)
    finally:
        for h in handles:
            h.remove()
    for n in names:
        b = fmods[n].bias
        assert b is not None  # one of the correctable_layers
        b.data += total[n].to(device=b.device, dtype=b.dtype)
    log.info("bias correction: %d layer(s) corrected on %d sample(s)", len(names), count)
    return total
