"""Per-layer accuracy report: how far each quantized layer's output in the fake-quant model is
from the float model on held-out batches, worst (lowest cosine) first.

Why: AMCT tells users to look for layers whose output cosine similarity drops below 0.99. Both
models run on the same batch in lockstep, node by node, and each reported layer's pair of outputs
goes into running sums as soon as both exist, so the report holds the two forwards' live
activations and a few numbers per layer, whatever the number of layers. Where every layer treats
each sample on its own, a batch runs in pieces of ``CHUNK_SAMPLES`` samples, so the memory does
not grow with the batch size either. docs/performance.md."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch import fx, nn

from amct_torch.arguments import checked, names_arg, non_negative_int, opt, sequence_of, torch_module
from amct_torch.files.atomic import atomic_write_text

#: AMCT's rule of thumb: a layer under this cosine deserves a look
COSINE_WARN = 0.99


@dataclass
class LayerStat:
    """One quantized layer: ``cosine`` and ``sqnr_db`` of its fake-quant output against the
    float output (all elements of all batches), ``numel`` elements compared."""

    layer: str
    type: str
    cosine: float
    sqnr_db: float
    numel: int

    @property
    def flagged(self) -> bool:
        return not self.cosine >= COSINE_WARN


class _Acc:
    def __init__(self) -> None:
        self.xy = self.xx = self.yy = self.ee = 0.0
        self.n = 0
        self.skipped = 0  # pairs of different sizes (behind a data-dependent layer such as Proposal)

    #: elements per float64 chunk: bounds the temporary copies to a few MiB per layer
    CHUNK = 1 << 18

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.detach().reshape(-1), y.detach().reshape(-1)
        if x.numel() != y.numel():  # e.g. another number of proposals: no element pairs
            self.skipped += 1
            return
        sums = torch.zeros(4, dtype=torch.float64, device=x.device)
        for i in range(0, x.numel(), self.CHUNK):
            a = x[i:i + self.CHUNK].double()
            b = y[i:i + self.CHUNK].double()
            sums[0] += a @ b
            sums[1] += a @ a
            sums[2] += b @ b
            b.sub_(a)
            sums[3] += b @ b
        vals = sums.tolist()
        self.xy += vals[0]
        self.xx += vals[1]
        self.yy += vals[2]
        self.ee += vals[3]
        self.n += x.numel()

    def cosine(self) -> float:
        if self.xx == 0.0 and self.yy == 0.0:
            return 1.0
        if self.xx == 0.0 or self.yy == 0.0:
            return 0.0
        return self.xy / math.sqrt(self.xx * self.yy)

    def sqnr(self) -> float:
        if self.ee == 0.0:
            return math.inf
        if self.xx == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.xx / self.ee)


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"layer output is {type(out).__name__}, not a tensor")


def _capture(model: fx.GraphModule, layers: Sequence[str], store: dict) -> list:
    from amct_torch.caffe.graph import layer_modules

    mods = layer_modules(model)
    handles = []
    for name in layers:
        def hook(_m, _a, out, name=name):
            # a copy: Caffe's in-place layers (ReLU after a conv) may overwrite the tensor later
            store[name] = _first_tensor(out).detach().clone()
        handles.append(mods[name].register_forward_hook(hook))
    return handles


def _call(model: nn.Module, batch: Any) -> Any:
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def _layer_outputs(gm: fx.GraphModule, batch: Any, wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Run ``gm`` on ``batch`` node by node (what its generated forward does, module hooks
    included) and yield ``(layer, output)`` as each layer in ``wanted`` finishes. A value is
    dropped after its last use, as in the generated code, so in-place layers behave the same;
    a yielded tensor is valid only until the generator resumes."""
    from amct_torch.caffe.layers import CaffeLayer

    nodes = list(gm.graph.nodes)
    last: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        for a in node.all_input_nodes:
            last[a] = i
    inputs = iter(batch if isinstance(batch, tuple) else (batch,))
    env: dict[fx.Node, Any] = {}
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            env[node] = next(inputs)
        elif node.op == "output":
            break
        else:
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            if node.op == "call_module":
                mod = gm.get_submodule(node.target)
                out = mod(*args, **kwargs)
                if isinstance(mod, CaffeLayer) and mod.caffe_name in wanted:
                    yield mod.caffe_name, _first_tensor(out)
            elif node.op == "call_function":
                out = node.target(*args, **kwargs)
            elif node.op == "call_method":
                out = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:  # get_attr: a parameter, buffer or attribute by dotted path
                out = gm
                for part in node.target.split("."):
                    out = getattr(out, part)
            env[node] = out
        for a in node.all_input_nodes:
            if last[a] == i:
                del env[a]


#: samples per lockstep pass: the two models' live activations at batch 32 added ~250 MB to
#: the nsfw job's peak; at 8 they add a quarter of that, at the same speed per sample
CHUNK_SAMPLES = 8

def _per_sample(*models: nn.Module) -> bool:
    """True when every layer of the models computes each sample independently of the others,
    so a batch may run in smaller pieces with the same outputs (no batch statistics, no
    layer acting on axis 0, no layer type without the ``per_sample`` trait)."""
    from amct_torch.caffe.layers import CaffeLayer
    from amct_torch.caffe.layers.traits import is_per_sample

    for model in models:
        for mod in model.modules():
            if not isinstance(mod, CaffeLayer):
                continue
            if not is_per_sample(mod) or getattr(mod, "uses_batch_stats", False):
                return False
            axis = getattr(mod, "axis", 1)  # a negative axis may be axis 0: not split either
            if axis is not None and axis <= 0:
                return False
    return True


def _chunks(batch: Any, size: int) -> list:
    """``batch`` (a tensor or a tuple of tensors with one batch size) in pieces of ``size``
    samples; the batch itself when its inputs differ in batch size."""
    xs = batch if isinstance(batch, tuple) else (batch,)
    n = xs[0].shape[0] if xs and xs[0].dim() else 0
    if n <= size or any(x.dim() == 0 or x.shape[0] != n for x in xs):
        return [batch]
    parts = [tuple(x[i:i + size] for x in xs) for i in range(0, n, size)]
    return parts if isinstance(batch, tuple) else [p[0] for p in parts]


def _stream_batch(float_model: fx.GraphModule, quant_model: fx.GraphModule, batch: Any,
                  accs: dict) -> None:
    """One batch through both models in lockstep; each layer's pair of outputs goes into its
    running sums as soon as both exist. Layers come in the same order in both graphs (the
    fake-quant graph is the float graph plus Quant/DeQuant layers); should one come early, its
    output is kept (a copy) until the other model produces the layer."""
    wanted = set(accs)
    quant = _layer_outputs(quant_model, batch, wanted)
    early: dict[str, torch.Tensor] = {}
    for name, x in _layer_outputs(float_model, batch, wanted):
        while name not in early:
            qname, y = next(quant)
            if qname == name:
                accs[name].add(x, y)
                break
            early[qname] = y.clone()
        else:
            accs[name].add(x, early.pop(name))
    for _ in quant:  # run the fake-quant model to its end (hooks, nothing more to compare)
        pass


@checked(float_model=torch_module, quant_model=torch_module, layers=names_arg)
def layer_report(float_model: fx.GraphModule, quant_model: fx.GraphModule, batches: Iterable[Any],
                 layers: Sequence[str], device: Optional[torch.device] = None) -> list[LayerStat]:
    """Compare the outputs of ``layers`` (Caffe names present in both models) over ``batches``
    (tensors, or tuples for several inputs) and return one ``LayerStat`` per layer, worst
    first. The models are run in eval mode without gradients on ``device`` (default: where
    their parameters are)."""
    from amct_torch.caffe.graph import layer_modules

    types = {n: m.caffe_type for n, m in layer_modules(float_model).items()}
    accs = {n: _Acc() for n in layers}
    streaming = isinstance(float_model, fx.GraphModule) and isinstance(quant_model, fx.GraphModule)
    chunk = CHUNK_SAMPLES if streaming and _per_sample(float_model, quant_model) else None
    f_out: dict = {}
    q_out: dict = {}
    handles = [] if streaming else _capture(float_model, layers, f_out) + _capture(quant_model, layers, q_out)
    try:
        with torch.no_grad():
            for batch in batches:
                if device is not None:
                    batch = tuple(b.to(device) for b in batch) if isinstance(batch, tuple) \
                        else batch.to(device)
                if streaming:
                    for part in (_chunks(batch, chunk) if chunk else [batch]):
                        _stream_batch(float_model, quant_model, part, accs)
                    continue
                _call(float_model, batch)
                _call(quant_model, batch)
                for n in layers:
                    accs[n].add(f_out[n], q_out[n])
                f_out.clear()
                q_out.clear()
    finally:
        for h in handles:
            h.remove()
    # a layer whose outputs never had the same size in both models (it follows a layer whose
    # output size depends on the values, such as the proposals) has no figure
    stats = [LayerStat(n, types.get(n, "?"), accs[n].cosine(), accs[n].sqnr(), accs[n].n)
             for n in layers if accs[n].n or not accs[n].skipped]
    stats.sort(key=lambda s: (s.cosine, s.sqnr_db))
    return stats


@checked(stats=sequence_of(LayerStat), limit=opt(non_negative_int))
def format_table(stats: Sequence[LayerStat], limit: Optional[int] = None) -> str:
    """A fixed-width table (worst first); ``limit`` rows at most, with a note of the rest."""
    rows = list(stats if limit is None else stats[:limit])
    width = max([len("layer")] + [len(s.layer) for s in rows])
    tw = max([len("type")] + [len(s.type) for s in rows])
    lines = [f"{'layer':<{width}}  {'type':<{tw}}  {'cosine':>8}  {'SQNR dB':>8}"]
    for s in rows:
        mark = f"  <- below {COSINE_WARN:.2f}" if s.flagged else ""
        lines.append(f"{s.layer:<{width}}  {s.type:<{tw}}  {s.cosine:>8.5f}  {s.sqnr_db:>8.2f}{mark}")
    if limit is not None and len(stats) > limit:
        lines.append(f"... {len(stats) - limit} more layer(s) in the JSON report")
    return "\n".join(lines)


def report_json(stats: Sequence[LayerStat], meta: Optional[dict] = None) -> dict:
    """The JSON document of a report: ``meta`` plus ``layers`` (worst first)."""
    def clean(v: float) -> Any:
        return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    layers = []
    for s in stats:
        d = asdict(s)
        d["cosine"], d["sqnr_db"] = clean(s.cosine), clean(s.sqnr_db)
        d["below_0.99"] = s.flagged
        layers.append(d)
    return {**(meta or {}), "cosine_warn": COSINE_WARN, "layers": layers}


def write_report(path: str, stats: Sequence[LayerStat], meta: Optional[dict] = None) -> None:
    """Write the JSON report atomically."""
    atomic_write_text(path, json.dumps(report_json(stats, meta), indent=2) + "\n")
