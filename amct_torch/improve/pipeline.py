"""The improvements of ``quantize(improve=...)`` applied in their fixed order, guarded.

Order (``output_names.IMPROVEMENTS``): cross-layer equalization first (it changes the weights,
so the weight factors and the activation calibration are computed again on the equalized
model), then one sequential pass that refines each layer in graph order: the output-error
activation range, the learned weight rounding (``adaround.py``, on the input quantized with
that range) and the bias correction (it must see the final range and weights).

Data: the calibration batches the job kept. The last batch is held out from every fitting
(a single batch is split: its last quarter); the fitting rows are the other batches' first
``max_fit`` samples, the held-out rows at most ``max_held``. Guards (docs/algorithms.md):
per layer inside the refining pass (``refine.py``); per model for equalization (its pairs
change the calibrated ranges of the layers around them, so it is judged on the net outputs);
and at the end on the net outputs: of the stages (AMCT's default, + equalization, + refining)
the one kept has the best worst-output SQNR against the float model on the held-out rows among
those where no output is worse than the default's, neither on all held-out rows nor on either
half of them, and whose worst output gains at least ``MARGIN_DB`` -- so the result is never
worse than AMCT's on any output of the held-out data, and a gain carried by a few rows is
not taken. On a small net whose outputs have few positions, the stages are judged on two
folds with the fitting and held-out roles swapped (``folds.py``), and its range search only
widens AMCT's clips (``refine.WIDER``).
"""
from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import fx

from amct_torch.record import LayerRecord

log = logging.getLogger("amct_torch")

Recalibrate = Callable[[fx.GraphModule], dict]


#: a stage replaces the default only when its worst-output SQNR on the held-out rows is at
#: least this much higher (the held-out rows are few: smaller gains are mostly noise)
MARGIN_DB = 0.2


@dataclass
class Stage:
    """One candidate model: its name, per-output SQNR (dB) on the held-out rows (``sqnr_db``)
    and on each half of them (``halves``), and cost."""

    name: str
    sqnr_db: list[float]
    seconds: float = 0.0
    halves: list[list[float]] = field(default_factory=list)
    #: cross-fitted with one model per fold (``folds.py``): ``halves`` are the folds, each
    #: scored on its own model; ``_better`` sets ``fold`` to the fold whose model may be kept
    per_fold: bool = False
    fold: int = 0

    @property
    def worst_db(self) -> float:
        return min(self.sqnr_db) if self.sqnr_db else math.inf


@dataclass
class Improvement:
    """The model to write (``fused``, ``records``), the float model (unchanged, BN-fused), the
    float model in the kept model's channel scaling (``reference``: the equalized float model
    when equalization was kept, else ``float_model``; its layer outputs are what the kept
    model's layers approximate, so the per-layer report compares with it) and what each stage
    did and cost."""

    fused: fx.GraphModule
    records: dict[str, LayerRecord]
    float_model: fx.GraphModule
    reference: Any = None
    stages: list[Stage] = field(default_factory=list)
    kept: str = "default"
    layers: dict[str, dict] = field(default_factory=dict)
    pairs: int = 0
    #: the stages were judged on two folds with swapped roles (``folds.py``)
    cross_fitted: bool = False

    def summary(self) -> dict:
        """JSON-able: per stage the worst-output SQNR and seconds, the one kept, per layer changes."""
        base = self.stages[0].worst_db if self.stages else math.nan
        return {"kept": self.kept, "equalized_pairs": self.pairs, "cross_fitted": self.cross_fitted,
                "stages": [{"name": s.name, "worst_output_sqnr_db": round(s.worst_db, 3),
                            "gain_db": round(s.worst_db - base, 3), "seconds": round(s.seconds, 3),
                            **({"fold": s.fold} if s.per_fold else {})}
                           for s in self.stages],
                "layers": self.layers}

    def line(self) -> str:
        """One line for the job's summary."""
        parts = [f"{s.name} {s.worst_db:.2f} dB ({s.seconds:.1f} s)" for s in self.stages]
        return f"improve: kept {self.kept}; held-out worst-output SQNR: " + ", ".join(parts)


def _rows(batches: Sequence[Any]) -> list[tuple]:
    return [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in batches]


def split(batches: Sequence[Any], max_fit: int = 32, max_held: int = 64) -> tuple[tuple, int]:
    """(fit rows then held-out rows, as one tuple of tensors; the number of fit rows)."""
    rows = _rows(batches)
    if not rows:
        raise ValueError("the improvements need calibration batches")
    if len(rows) >= 2:
        fit_parts, held = rows[:-1], rows[-1]
    else:
        n = rows[0][0].shape[0]
        if n < 2:
            raise ValueError("the improvements need at least 2 calibration samples (one held out)")
        cut = n - max(1, n // 4)
        fit_parts, held = [tuple(t[:cut] for t in rows[0])], tuple(t[cut:] for t in rows[0])
    fit = tuple(torch.cat([torch.as_tensor(p[i]) for p in fit_parts])[:max_fit] for i in range(len(held)))
    held = tuple(torch.as_tensor(t)[:max_held] for t in held)
    return tuple(torch.cat([f, h]) for f, h in zip(fit, held)), int(fit[0].shape[0])


def _outputs(y: Any) -> list[torch.Tensor]:
    if isinstance(y, torch.Tensor):
        return [y]
    if isinstance(y, dict):
        y = list(y.values())
    return [t for t in y if isinstance(t, torch.Tensor)]


def net_outputs(model: fx.GraphModule, data: tuple) -> list[torch.Tensor]:
    """The net's outputs on ``data``, an output made by a Softmax replaced by that Softmax's
    input (the logits: saturated probabilities hide most of the error, and the guard must see it)."""
    out_node = next(n for n in model.graph.nodes if n.op == "output")
    args = out_node.args[0]
    nodes = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (list, tuple)) else [args]
    caught: dict[int, torch.Tensor] = {}
    handles = []
    for i, n in enumerate(nodes):
        if isinstance(n, fx.Node) and n.op == "call_module":
            mod = model.get_submodule(str(n.target))
            if getattr(mod, "caffe_type", None) == "Softmax":
                handles.append(mod.register_forward_hook(
                    lambda _m, a, _y, i=i: caught.__setitem__(i, a[0])))
    try:
        with torch.no_grad():
            out = _outputs(model(*data))
    finally:
        for h in handles:
            h.remove()
    return [caught.get(i, t) for i, t in enumerate(out)]


def _db(p: float, e: float) -> float:
    return 10 * math.log10(max(p, 1e-30) / max(e, 1e-30))


def _row_powers(model: fx.GraphModule, ref: list[torch.Tensor], data: tuple) -> list[torch.Tensor]:
    """Per scored output, [2, rows] float64: each row's signal power (``ref``) and the power of
    ``model``'s error against it (``net_outputs`` on ``data``); device tensors, no host read."""
    out = net_outputs(model, data)
    res = []
    for q, r in zip(out, ref):
        if q.shape != r.shape or q.shape[0] < 1:  # a data-dependent output (DetectionOutput)
            continue
        r64, q64 = r.double().reshape(r.shape[0], -1), q.double().reshape(q.shape[0], -1)
        res.append(torch.stack([r64.pow(2).sum(dim=1), (q64 - r64).pow(2).sum(dim=1)]))
    return res


def scored(parts: list[list[torch.Tensor]], name: str = "", seconds: float = 0.0) -> Stage:
    """The stage of per-part row powers (``_row_powers``, the same outputs in each part): SQNR
    (dB) of each output over all parts, and on each part alone (``halves``; one host read)."""
    n_out = min(len(p) for p in parts) if parts else 0
    if n_out == 0:
        return Stage(name, [], seconds)
    sums = torch.stack([torch.stack([p[o].sum(dim=1) for p in parts]) for o in range(n_out)]).cpu().tolist()
    st = Stage(name, [_db(sum(v[0] for v in out), sum(v[1] for v in out)) for out in sums], seconds)
    st.halves = [[_db(out[k][0], out[k][1]) for out in sums] for k in range(len(parts))]
    return st


def output_sqnr(model: fx.GraphModule, ref: list[torch.Tensor], data: tuple,
                name: str = "", seconds: float = 0.0) -> Stage:
    """The stage of ``model``: SQNR (dB) of each output (``net_outputs``) on ``data`` against
    ``ref``, on all rows and on each half of them (one host read)."""
    rows = _row_powers(model, ref, data)
    n = int(data[0].shape[0])
    if n < 2:
        st = scored([rows], name, seconds)
        st.halves = []
        return st
    h = max(1, n // 2)
    return scored([[t[:, :h] for t in rows], [t[:, h:] for t in rows]], name, seconds)


def improve_model(fused: fx.GraphModule, records: Mapping[str, LayerRecord], batches: Sequence[Any],
                  device: torch.device, names: Sequence[str], recalibrate: Recalibrate,
                  quant_layers: Sequence[str], max_fit: int = 32, max_held: int = 64) -> Improvement:
    """Apply ``names`` (a subset of ``IMPROVEMENTS``) to the calibrated ``fused``/``records``
    and return the guarded result; ``fused`` itself is never changed. ``recalibrate(gm)``: the
    full record (weight + activation factors) of an equalized copy, calibrated as AMCT does."""
    from amct_torch.export import fake_quant_graph
    from amct_torch.improve.cle import equalize, find_pairs
    from amct_torch.improve.folds import other_fold
    from amct_torch.improve.refine import MULTIPLIERS, WIDER, refine

    data, n_fit = split(batches, max_fit, max_held)
    data = tuple(t.to(device) for t in data)
    held = tuple(t[n_fit:] for t in data)
    float_model = fused
    ref = net_outputs(float_model, held)
    fold2 = other_fold(data, n_fit, ref, max_fit, max_held, sum(p.numel() for p in fused.parameters()))
    held2 = tuple(t[fold2[1]:] for t in fold2[0]) if fold2 else ()
    ref2 = net_outputs(float_model, held2) if fold2 else []

    def judge(models: list[fx.GraphModule], name: str, seconds: float = 0.0) -> Stage:
        """The stage of ``models`` (one per fold: fold 1's, then fold 2's where cross-fitted)."""
        if not fold2:
            return output_sqnr(models[0], ref, held, name, seconds)
        st = scored([_row_powers(models[0], ref, held), _row_powers(models[-1], ref2, held2)], name, seconds)
        st.per_fold = len(models) > 1
        return st

    default = judge([fake_quant_graph(fused, records).to(device)], "default")
    imp = Improvement(fused=fused, records=dict(records), float_model=float_model, stages=[default],
                      cross_fitted=fold2 is not None)
    candidates = {"default": (fused, dict(records), fused)}
    cur_gm, cur_rec = fused, dict(records)
    if "cle" in names:
        t0 = time.perf_counter()
        gm = copy.deepcopy(fused)
        pairs = equalize(gm, find_pairs(gm, quant_layers))
        imp.pairs = len(pairs)
        if pairs:  # nothing fitted on rows (the recalibration is AMCT's on every batch): one model
            rec = recalibrate(gm)
            st = judge([fake_quant_graph(gm, rec).to(device)], "cle", time.perf_counter() - t0)
            imp.stages.append(st)
            candidates["cle"] = (gm, rec, gm)
            if _better(st, default):
                cur_gm, cur_rec = gm, rec
    ranges, rounding, bias = "output_ranges" in names, "adaround" in names, "bias_correction" in names
    if ranges or rounding or bias:
        t0 = time.perf_counter()
        mults = WIDER if fold2 else MULTIPLIERS   # few held-out values: the clip only widens
        runs = [refine(cur_gm, cur_rec, data, n_fit, ranges=ranges, bias=bias, rounding=rounding,
                       multipliers=mults)]
        if fold2:
            runs.append(refine(cur_gm, cur_rec, fold2[0], fold2[1], ranges=ranges, bias=bias,
                               rounding=rounding, multipliers=mults))
        gms = [_refined_model(cur_gm, r, device) for r in runs]
        label = "+".join(n for n in ("output_ranges", "adaround", "bias_correction") if n in names)
        label = ("cle+" + label) if cur_gm is not fused else label
        st = judge([fake_quant_graph(g, r.records).to(device) for g, r in zip(gms, runs)], label,
                   time.perf_counter() - t0)
        imp.stages.append(st)
        k = st.fold if _better(st, default) else 0  # the model of the fold that passed
        res = runs[k]
        candidates[label] = (gms[k], res.records, cur_gm)
        imp.layers = {n: {"range_multiplier": c.multiplier, "range_db": round(c.range_db, 3),
                          "rounding_kept": c.rounding_kept, "rounding_db": round(c.rounding_db, 3),
                          "bias_kept": c.bias_kept, "bias_mean_error_db": round(c.bias_db, 3)}
                      for n, c in res.changes.items()}
    best = max((s for s in imp.stages if s is default or _better(s, default)), key=lambda s: s.worst_db)
    imp.kept = best.name
    imp.fused, rec, imp.reference = candidates[best.name]
    imp.records = dict(rec)
    log.info("%s", imp.line())
    return imp


def _refined_model(base: fx.GraphModule, res: Any, device: torch.device) -> fx.GraphModule:
    """``base`` with the refining pass's bias deltas and learned weights (a copy when any)."""
    from amct_torch.caffe.graph import layer_modules

    gm = copy.deepcopy(base) if res.bias_delta or res.weights else base
    mods: dict[str, Any] = layer_modules(gm)
    for n, d in res.bias_delta.items():
        mods[n].bias.data += d.to(device=mods[n].bias.device, dtype=mods[n].bias.dtype)
    for n, w in res.weights.items():  # codes · scale_w: the exporters' ARQ grid gives the codes back
        mods[n].weight.data = w.to(device=mods[n].weight.device, dtype=mods[n].weight.dtype).clone()
    return gm


def _better(stage: Stage, default: Stage) -> bool:
    """``stage`` may replace the default: no output below the default's SQNR on the held-out
    rows, and the worst output at least ``MARGIN_DB`` higher; and a gain carried by a few rows
    is not kept: with one model, no output below the default on either half of the held-out
    rows (either fold where cross-fitted); with one model per fold (``folds.py``), the model
    kept has no output below the default on its own held-out rows and its worst output at least
    ``MARGIN_DB`` higher there (fold 1's when it does; ``stage.fold`` is set to it), the other
    fold having judged the same procedure on other rows through the totals."""
    if len(stage.sqnr_db) != len(default.sqnr_db):
        return False
    if not (all(s >= d for s, d in zip(stage.sqnr_db, default.sqnr_db))
            and stage.worst_db >= default.worst_db + MARGIN_DB):
        return False
    halves = list(zip(stage.halves, default.halves))
    ok = [all(s >= d for s, d in zip(a, b)) for a, b in halves]
    if not stage.per_fold:
        return all(ok)
    # the model kept must itself gain the margin on its own held-out rows (fold 1's first)
    passing = [k for k, (a, b) in enumerate(halves) if ok[k] and a and b and min(a) >= min(b) + MARGIN_DB]
    if not passing:
        return False
    stage.fold = passing[0]
    return True


def improve_graph(graph: Any, records: Mapping[str, LayerRecord], batches: Sequence[Any],
                  device: torch.device, names: Sequence[str], ifmr_mode: str = "streaming") -> Improvement:
    """The job's step: ``improve_model`` on the calibrated ``graph`` (a ``QuantGraph``), whose
    ``fused`` becomes the model kept (what the record, the Caffe models and the QDQ ONNX are
    written from); ``Improvement.float_model`` is the unchanged fused float model (the float
    ONNX, the report's and the caller's reference)."""
    from amct_torch.improve.recalibrate import recalibrate

    batches = list(batches)
    imp = improve_model(graph.fused, records, batches, device, names,
                        lambda gm: recalibrate(graph, gm, batches, device, ifmr_mode), graph.quant_layers)
    graph.fused = imp.fused
    return imp
