"""The improvements of ``quantize(improve=...)`` applied in their fixed order, guarded.

Cross-layer equalization first (it changes the weights, so the factors are computed again),
then one sequential pass that refines each layer in graph order (``refine.py``: output-error
activation ranges, learned rounding, bias correction). Each stage is judged against AMCT's
default on rows no fitting saw (the data beyond the calibration batches, cross-fitted by
``folds.py`` where it is short) by a paired statistic per net output, and kept only when no
output's lower confidence bound is below zero and its worst output gains. docs/algorithms.md,
"Improvements beyond AMCT"."""
from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import fx

from amct_torch.improve.names import IMPROVEMENTS
from amct_torch.inputs.batching import HELD_ROWS  # rows wanted beyond calibration; fewer: cross-fit
from amct_torch.record import LayerRecord

log = logging.getLogger("amct_torch")

Recalibrate = Callable[[fx.GraphModule], dict]

#: one-sided confidence of the stage guard: every output's mean gain must be at least this many
#: standard errors above zero (95 %)
Z = 1.645
#: most rows beyond the calibration batches the guard reads (each stage's model runs on them)
MAX_HELD = 256
#: most calibration rows the refining pass fits on, and most rows of its per-layer guard
FIT_ROWS = 32
GUARD_ROWS = 64
#: fewest rows the paired statistic is computed on; with fewer the improvements are skipped
MIN_ROWS = 8
#: rows per forward when judging (a ResNet-50's activations for 64 rows at once cost 1.7x the
#: CPU time of 8 forwards of 8 rows: every new large temporary is freshly mapped memory)
CHUNK_ROWS = 8


@dataclass
class Stage:
    """One candidate model: per-output SQNR (dB) on the judged rows, per-output gain over the
    default (dB, of the mean error powers), its standard error and its lower confidence bound
    (dB), whether the guard passed it, and cost."""

    name: str
    sqnr_db: list[float]
    seconds: float = 0.0
    gain_db: list[float] = field(default_factory=list)
    error_db: list[float] = field(default_factory=list)
    lower_db: list[float] = field(default_factory=list)
    passed: bool = False

    @property
    def worst_db(self) -> float:
        return min(self.sqnr_db) if self.sqnr_db else math.inf


@dataclass
class Improvement:
    """The model to write (``fused``, ``records``), the float model (unchanged, BN-fused), the
    float model in the kept model's channel scaling (``reference``: the equalized float model
    when equalization was kept, else ``float_model``; its layer outputs are what the kept
    model's layers approximate, so the per-layer report compares with it), what each stage
    did and cost, and the rows the guard judged on."""

    fused: fx.GraphModule
    records: dict[str, LayerRecord]
    float_model: fx.GraphModule
    reference: Any = None
    stages: list[Stage] = field(default_factory=list)
    kept: str = "default"
    layers: dict[str, dict] = field(default_factory=dict)
    pairs: int = 0
    #: rows judged beyond the calibration batches, and calibration rows cross-fitted (in folds)
    held_rows: int = 0
    cross_rows: int = 0
    folds: int = 0
    #: why the improvements were skipped (too few rows), else None
    skipped: Optional[str] = None

    def summary(self) -> dict:
        """JSON-able: the rows judged, per stage the worst-output SQNR, per-output gain ±
        standard error, verdict and seconds, the stage kept, per layer changes."""
        base = self.stages[0].worst_db if self.stages else math.nan
        return {"kept": self.kept, "skipped": self.skipped, "equalized_pairs": self.pairs,
                "rows": self.held_rows + self.cross_rows, "held_out_rows": self.held_rows,
                "cross_fitted_rows": self.cross_rows, "folds": self.folds,
                "cross_fitted": self.cross_rows > 0,
                "stages": [{"name": s.name, "worst_output_sqnr_db": round(s.worst_db, 3),
                            "gain_db": round(s.worst_db - base, 3),
                            "output_gain_db": [round(g, 3) for g in s.gain_db],
                            "output_error_db": [round(e, 3) for e in s.error_db],
                            "passed": s.passed, "seconds": round(s.seconds, 3)}
                           for s in self.stages],
                "layers": self.layers}

    def line(self) -> str:
        """One line for the job's summary."""
        return summary_line(self.summary())


def summary_line(s: Mapping[str, Any]) -> str:
    """The ``improve:`` line of a summary (``Improvement.summary``): what was kept, on how many
    rows, and per stage each output's gain ± standard error and the verdict."""
    if not s["stages"]:
        return f"improve: kept {s['kept']}; {s.get('skipped')}"
    rows = f"{s['rows']} rows ({s['held_out_rows']} beyond calibration"
    rows += f", {s['cross_fitted_rows']} calibration rows cross-fitted in {s['folds']} folds)" \
        if s["cross_fitted_rows"] else ")"
    parts = []
    for st in s["stages"][1:]:
        gains = " / ".join(f"{g:+.2f} ± {e:.2f}" for g, e in zip(st["output_gain_db"], st["output_error_db"]))
        parts.append(f"{st['name']} {gains} dB {'passed' if st['passed'] else 'rejected'} ({st['seconds']:.1f} s)")
    worst = s["stages"][0]["worst_output_sqnr_db"]
    if s.get("skipped"):
        parts.append(str(s["skipped"]))
    return (f"improve: kept {s['kept']} on {rows}; default worst output {worst:.2f} dB; "
            + ("; ".join(parts) or "no candidate"))


def _rows(batches: Sequence[Any]) -> list[tuple]:
    return [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in batches]


def _count(batches: Sequence[Any]) -> int:
    firsts = (torch.as_tensor(r[0]) for r in _rows(batches))
    return sum(int(t.shape[0]) if t.dim() else 1 for t in firsts)


def split(batches: Sequence[Any]) -> tuple[tuple, int]:
    """(fit rows then the refining pass's per-layer guard rows, as one tuple of tensors; the
    number of fit rows): the last batch is the guard rows (a single batch: its last quarter)."""
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
    fit = tuple(torch.cat([torch.as_tensor(p[i]) for p in fit_parts])[:FIT_ROWS] for i in range(len(held)))
    held = tuple(torch.as_tensor(t)[:GUARD_ROWS] for t in held)
    return tuple(torch.cat([f, h]) for f, h in zip(fit, held)), int(fit[0].shape[0])


def _concat(batches: Sequence[Any], limit: int) -> tuple:
    """The rows of ``batches`` as one tuple of tensors (at most ``limit`` rows), or ()."""
    rows = _rows(batches)
    if not rows:
        return ()
    return tuple(torch.cat([torch.as_tensor(r[i]) for r in rows])[:limit] for i in range(len(rows[0])))


def _outputs(y: Any) -> list[torch.Tensor]:
    if isinstance(y, torch.Tensor):
        return [y]
    if isinstance(y, dict):
        y = list(y.values())
    return [t for t in y if isinstance(t, torch.Tensor)]


def net_outputs(model: fx.GraphModule, data: tuple) -> list[torch.Tensor]:
    """The net's outputs on ``data``, an output made by a Softmax replaced by that Softmax's
    input (the logits: saturated probabilities hide most of the error, and the guard must see it)."""
    caught: dict[int, torch.Tensor] = {}
    handles = []
    for i, mod in enumerate(_output_modules(model)):
        if mod is not None and getattr(mod, "caffe_type", None) == "Softmax":
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


def _output_modules(model: fx.GraphModule) -> list[Optional[torch.nn.Module]]:
    """Per net output, in order, the module that makes it (None where no module does)."""
    out_node = next(n for n in model.graph.nodes if n.op == "output")
    args = out_node.args[0]
    nodes = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (list, tuple)) else [args]
    return [model.get_submodule(str(n.target)) if isinstance(n, fx.Node) and n.op == "call_module" else None
            for n in nodes]


def _output_types(model: fx.GraphModule) -> set:
    """The Caffe types of the modules whose outputs are the net's."""
    return {getattr(mod, "caffe_type", None) for mod in _output_modules(model) if mod is not None}


def _per_row(y: Optional[torch.Tensor], rows: int) -> bool:
    return y is not None and y.dim() >= 1 and int(y.shape[0]) == rows


def row_outputs(model: fx.GraphModule, data: tuple, one_by_one: bool = False) -> list[Optional[torch.Tensor]]:
    """``net_outputs`` on ``data``; with ``one_by_one``, sample by sample, the outputs stacked
    on a new first axis (a net whose Reshape joins the samples of a batch: RFB/slim's
    ``dim: 1 dim: -1``), None for an output whose shape varies between samples."""
    n = int(data[0].shape[0])
    if one_by_one:
        outs = [net_outputs(model, tuple(t[i:i + 1] for t in data)) for i in range(n)]
        return [torch.stack([o[k] for o in outs]) if all(o[k].shape == outs[0][k].shape for o in outs) else None
                for k in range(min(len(o) for o in outs))]
    parts = [net_outputs(model, tuple(t[i:i + CHUNK_ROWS] for t in data)) for i in range(0, n, CHUNK_ROWS)]
    if len(parts) == 1:
        return list(parts[0])
    return [torch.cat([p[k] for p in parts]) if all(_per_row(p[k], min(CHUNK_ROWS, n - i * CHUNK_ROWS))
                                                   for i, p in enumerate(parts)) else None
            for k in range(min(len(p) for p in parts))]


def _row_powers(model: fx.GraphModule, ref: list[Optional[torch.Tensor]], data: tuple,
                one_by_one: bool = False) -> list[Optional[torch.Tensor]]:
    """Per output, [2, rows] float64: each row's signal power (``ref``) and the power of
    ``model``'s error against it (``row_outputs`` on ``data``); None for an output whose shape
    depends on the data (DetectionOutput) or has no row per sample. Device tensors, no host read."""
    out = row_outputs(model, data, one_by_one)
    n = int(data[0].shape[0])
    res: list[Optional[torch.Tensor]] = []
    for q, r in zip(out, ref):
        if q is None or r is None or q.shape != r.shape or not _per_row(q, n):
            res.append(None)
            continue
        r64, q64 = r.double().reshape(r.shape[0], -1), q.double().reshape(q.shape[0], -1)
        res.append(torch.stack([r64.pow(2).sum(dim=1), (q64 - r64).pow(2).sum(dim=1)]))
    return res


class Judge:
    """The rows the stages are judged on: those beyond the calibration batches (``held``),
    then the calibration rows ``data`` block by block (``blocks``; none when not cross-fitted),
    with the float model's outputs on each."""

    def __init__(self, float_model: fx.GraphModule, held: tuple, data: tuple, blocks: list[torch.Tensor]) -> None:
        self.parts = ([held] if held else []) + [tuple(t[b.to(t.device)] for t in data) for b in blocks]
        self.n_held = 1 if held else 0
        self.refs = [row_outputs(float_model, p) for p in self.parts]
        # no output with a row per sample, and none made by a DetectionOutput (its shape follows
        # the detections): every part's rows run one at a time
        self.one_by_one = bool(self.parts) and not any(
            _per_row(r, int(p[0].shape[0])) for p, rs in zip(self.parts, self.refs) for r in rs
        ) and "DetectionOutput" not in _output_types(float_model)
        if self.one_by_one:
            self.refs = [row_outputs(float_model, p, True) for p in self.parts]

    def rows(self, model: fx.GraphModule, per_block: Optional[Callable[[int], fx.GraphModule]] = None
             ) -> list[Optional[torch.Tensor]]:
        """Per output, [2, rows] (``_row_powers``) over every part: ``model`` on the held rows,
        and on each block ``per_block(j)`` (the model fitted without block j) or ``model``."""
        parts = []
        for i, (p, r) in enumerate(zip(self.parts, self.refs)):
            j = i - self.n_held
            m = per_block(j) if per_block is not None and j >= 0 else model
            parts.append(_row_powers(m, r, p, self.one_by_one))
        n_out = min(len(p) for p in parts) if parts else 0
        return [None if any(p[o] is None for p in parts) else torch.cat([p[o] for p in parts], dim=1)  # type: ignore[misc]
                for o in range(n_out)]


def compare(name: str, base: list[Optional[torch.Tensor]], cand: list[Optional[torch.Tensor]],
            seconds: float = 0.0) -> Stage:
    """The stage of ``cand``'s row powers against the default's (``base``, the same rows): per
    output the SQNR, and from the per-row differences of error power (default − candidate)
    their mean and standard error, as the gain in dB of the mean error power ± its standard
    error and the gain at the lower confidence bound (mean − ``Z`` standard errors). One host read."""
    pairs = [(b, c) for b, c in zip(base, cand) if b is not None and c is not None]
    if not pairs:
        return Stage(name, [], seconds)
    n = int(pairs[0][0].shape[1])
    stats = []
    for b, c in pairs:
        d = b[1] - c[1]
        sd = d.std() if n > 1 else torch.zeros((), dtype=d.dtype, device=d.device)
        stats.append(torch.stack([b[0].sum(), b[1].sum(), c[1].sum(), d.mean(), sd]))
    st = Stage(name, [], seconds)
    for p, e_b, e_c, mean_d, sd in torch.stack(stats).cpu().tolist():
        se = sd / math.sqrt(n)
        mean_b, mean_c = e_b / n, e_c / n
        st.sqnr_db.append(_db(p, e_c))
        st.gain_db.append(_db(e_b, e_c))
        st.error_db.append(10 / math.log(10) * se / max(mean_c, 1e-30))
        low = mean_d - Z * se   # the candidate's mean error at the bound: mean_b − low
        st.lower_db.append(math.inf if mean_b - low <= 0 else _db(mean_b, mean_b - low))
    return st


def _keep(stage: Stage, default: Stage) -> bool:
    """The guard: ``stage`` may replace the default when no output's lower confidence bound of
    the gain is below zero and its worst output's SQNR is higher than the default's."""
    return (0 < len(stage.sqnr_db) == len(default.sqnr_db) and all(lo >= 0 for lo in stage.lower_db)
            and stage.worst_db > default.worst_db)


def _choose(stages: list[Stage]) -> Stage:
    """The stage kept: of the default and the stages that passed, the best worst output."""
    return max((s for s in stages if s is stages[0] or s.passed), key=lambda s: s.worst_db)


def _too_few(names: Sequence[str], n_cal: int, n_rows: int, n_held: int) -> str:
    return (f"{', '.join(names)} not applied: {n_rows} row(s) to judge them on ({n_cal} calibration "
            f"sample(s), {n_held} beyond them), the guard needs at least {MIN_ROWS}; give more samples "
            f"than batch_num × batch_size")


def improve_model(fused: fx.GraphModule, records: Mapping[str, LayerRecord], batches: Sequence[Any],
                  device: torch.device, names: Sequence[str], recalibrate: Recalibrate,
                  quant_layers: Sequence[str], held: Sequence[Any] = ()) -> Improvement:
    """Apply ``names`` (a subset of ``IMPROVEMENTS``) to the calibrated ``fused``/``records``
    and return the guarded result; ``fused`` itself is never changed. ``held``: batches of the
    data beyond the calibration ones (judged on first). ``recalibrate(gm)``: the full record
    (weight + activation factors) of an equalized copy, calibrated as AMCT does. Too few rows
    for the guard: a warning, and AMCT's result (``Improvement.skipped`` says why)."""
    from amct_torch.export import fake_quant_graph
    from amct_torch.improve import folds
    from amct_torch.improve.cle import equalize, find_pairs
    from amct_torch.improve.refine import MULTIPLIERS, WIDER, refine

    imp = Improvement(fused=fused, records=dict(records), float_model=fused, reference=fused)
    ext = tuple(t.to(device) for t in _concat(held, MAX_HELD))
    n_ext = int(ext[0].shape[0]) if ext else 0
    refining = [n for n in names if n != "cle"]
    n_cal = _count(batches)
    fit_ok = n_cal >= 2
    data: tuple = ()
    n_fit = 0
    if fit_ok:
        data, n_fit = split(batches)
        data = tuple(t.to(device) for t in data)
    params = sum(p.numel() for p in fused.parameters())
    blocks: list[torch.Tensor] = []
    if data and n_ext < HELD_ROWS:
        k = folds.FOLDS_SMALL if folds.small_net(data[0][0], params) else folds.FOLDS_LARGE
        blocks = folds.blocks(int(data[0].shape[0]), k)
        if any(int(data[0].shape[0]) - b.numel() < 2 for b in blocks):
            blocks = []   # a fold with fewer than 2 rows to fit on
    n_cross = sum(b.numel() for b in blocks)
    if n_ext + n_cross < MIN_ROWS:
        imp.skipped = _too_few(names, n_cal, n_ext + n_cross, n_ext)
        log.warning("improve: %s", imp.skipped)
        return imp
    if refining and not fit_ok:
        imp.skipped = (f"{', '.join(refining)} not applied: the refining pass needs at least 2 "
                       "calibration samples (one fits, one guards)")
        log.warning("improve: %s", imp.skipped)
        refining = []
    imp.held_rows, imp.cross_rows, imp.folds = n_ext, n_cross, len(blocks)
    judge = Judge(fused, ext, data, blocks)
    base = judge.rows(fake_quant_graph(fused, records).to(device))
    default = compare("default", base, base)
    if not default.sqnr_db:
        imp.skipped = (f"{', '.join(names)} not applied: no net output the guard can score (an output "
                       "whose shape follows the data, such as a DetectionOutput's)")
        log.warning("improve: %s", imp.skipped)
        return imp
    imp.stages = [default]
    candidates = {"default": (fused, dict(records), fused)}
    cur_gm, cur_rec = fused, dict(records)
    if "cle" in names:
        t0 = time.perf_counter()
        gm = copy.deepcopy(fused)
        pairs = equalize(gm, find_pairs(gm, quant_layers))
        imp.pairs = len(pairs)
        if pairs:  # nothing fitted on rows (the recalibration is AMCT's on every batch): one model
            rec = recalibrate(gm)
            st = compare("cle", base, judge.rows(fake_quant_graph(gm, rec).to(device)), time.perf_counter() - t0)
            st.passed = _keep(st, default)
            imp.stages.append(st)
            candidates["cle"] = (gm, rec, gm)
            if st.passed:
                cur_gm, cur_rec = gm, rec
    if refining:
        t0 = time.perf_counter()
        widen = folds.small_net(data[0][0], params) and folds.widen_only(
            net_outputs(fused, tuple(t[n_fit:] for t in data)), data[0][0], params)
        opts: dict[str, Any] = dict(ranges="output_ranges" in names, bias="bias_correction" in names,
                    rounding="adaround" in names, multipliers=WIDER if widen else MULTIPLIERS)
        res = refine(cur_gm, cur_rec, data, n_fit, **opts)
        gm = _refined_model(cur_gm, res, device)

        def fold_model(j: int) -> fx.GraphModule:   # the pass fitted without block j
            rows, nf = folds.fold_data(data, blocks[j])
            r = refine(cur_gm, cur_rec, rows, nf, **opts)
            return fake_quant_graph(_refined_model(cur_gm, r, device), r.records).to(device)

        label = "+".join(n for n in IMPROVEMENTS if n in names and n != "cle")
        label = ("cle+" + label) if cur_gm is not fused else label
        rows = judge.rows(fake_quant_graph(gm, res.records).to(device), fold_model if blocks else None)
        st = compare(label, base, rows, time.perf_counter() - t0)
        st.passed = _keep(st, default)
        imp.stages.append(st)
        candidates[label] = (gm, res.records, cur_gm)
        imp.layers = {n: {"range_multiplier": c.multiplier, "range_db": round(c.range_db, 3),
                          "rounding_kept": c.rounding_kept, "rounding_db": round(c.rounding_db, 3),
                          "bias_kept": c.bias_kept, "bias_mean_error_db": round(c.bias_db, 3)}
                      for n, c in res.changes.items()}
    imp.kept = _choose(imp.stages).name
    imp.fused, rec, imp.reference = candidates[imp.kept]
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


def improve_graph(graph: Any, records: Mapping[str, LayerRecord], batches: Sequence[Any],
                  device: torch.device, names: Sequence[str], ifmr_mode: str = "streaming",
                  held: Sequence[Any] = ()) -> Improvement:
    """The job's step: ``improve_model`` on the calibrated ``graph`` (a ``QuantGraph``), whose
    ``fused`` becomes the model kept (what the record, the Caffe models and the QDQ ONNX are
    written from); ``Improvement.float_model`` is the unchanged fused float model (the float
    ONNX, the report's and the caller's reference). ``held``: the batches after the
    calibration ones that the job read for the guard (and the per-layer report)."""
    from amct_torch.improve.recalibrate import recalibrate

    batches = list(batches)
    imp = improve_model(graph.fused, records, batches, device, names,
                        lambda gm: recalibrate(graph, gm, batches, device, ifmr_mode), graph.quant_layers,
                        held=list(held))
    graph.fused = imp.fused
    return imp
