"""One sequential pass over the fake-quant model that refines it layer by layer, guarded (opt-in,
beyond AMCT): activation ranges chosen by the layer's output error, the learned rounding
(``adaround.py``) and the empirical bias correction.

Why one pass: each refinement must see the layer's input as the quantized model produces it,
every earlier layer already quantized and refined; so they run in forward hooks of a simulated
fake-quant model, in graph order, over the fitting rows followed by the held-out rows. A choice
is fitted on the first part and kept only where it also lowers the layer's output error on the
second, else the layer keeps AMCT's factors. The candidates and the exact guards:
docs/algorithms.md, "Improvements beyond AMCT"."""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch
from torch import fx, nn

from amct_torch.algorithms.quant import fake_quant, to_float32
from amct_torch.caffe.graph import layer_modules
from amct_torch.caffe.layers.traits import is_weighted
from amct_torch.export.layer_quant import layer_quant
from amct_torch.improve.adaround import (
    Rounding,
    Sites,
    apply_weights,
    choose_sites,
    fake_weight,
    input_positions_per_row,
    iterations,
    learn_rounding,
    outputs_at,
    patches,
    scale_view,
    supported,
    weight_view,
)
from amct_torch.record import LayerRecord

#: scale multipliers tried for each layer's activation clip (1.0: AMCT's own)
MULTIPLIERS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
#: the multipliers where the stage guard is cross-fitted (``folds.py``: few held-out values
#: per output): only AMCT's clip or wider. A tighter clip trades the rare large values for the
#: common small ones, and the few calibration rows rarely hold the rare ones: on MTCNN det3
#: calibrated on 128 crops, the tighter clips chosen scored +0.9 dB on the held-out calibration
#: rows and -2.7 dB on 200 other crops; widening only: +0.7 dB there with the other steps
WIDER = (1.0, 1.1, 1.2, 1.35, 1.5)
#: fitting rows the range candidates run on, for a layer without a patch gatherer
#: (Deconvolution: one layer forward per candidate; the held-out rows run only AMCT's factor
#: and the winner)
SEARCH_ROWS = 8
#: fitting positions the range candidates are scored at, for the layers with one (every
#: other weighted layer; a spread subset of the learned rounding's sampled positions)
SEARCH_POSITIONS = 512


@dataclass
class LayerChange:
    """What the pass did to one layer (host values, read once after the pass): the range
    multiplier kept (1.0: AMCT's), the held-out output MSE before/after it, whether the bias
    correction was kept, and the held-out mean-error power before/after it."""

    multiplier: float = 1.0
    range_mse: tuple[float, float] = (math.nan, math.nan)
    bias_kept: bool = False
    bias_err: tuple[float, float] = (math.nan, math.nan)
    rounding_kept: bool = False
    rounding_mse: tuple[float, float] = (math.nan, math.nan)

    @property
    def range_db(self) -> float:
        return _gain_db(self.range_mse)

    @property
    def bias_db(self) -> float:
        return _gain_db(self.bias_err)

    @property
    def rounding_db(self) -> float:
        return _gain_db(self.rounding_mse)


def _gain_db(before_after: tuple[float, float]) -> float:
    """10·log10(before / after); 0 when either is not positive (nothing measured)."""
    a, b = before_after
    return 10 * math.log10(a / b) if a > 0 and b > 0 else 0.0


@dataclass
class Refined:
    """The refined record (new LayerRecords where the factors changed), the bias deltas kept
    per layer (to add to the fused float biases) and the per-layer changes."""

    records: dict[str, LayerRecord]
    bias_delta: dict[str, torch.Tensor] = field(default_factory=dict)
    changes: dict[str, LayerChange] = field(default_factory=dict)
    #: the learned-rounding weights kept (codes · scale_w, the module's layout) per layer
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


def _channel_mean(y: torch.Tensor) -> torch.Tensor:
    """Per-channel mean (axis 1), reduced in float32 and returned as float64: torch's float32
    reduction sums pairwise (relative error ~1e-6, far below the mean errors corrected), and a
    float64 copy of every layer output cost 20x more (measured: 0.16 s vs 0.008 s for a
    48x128x56x56 output)."""
    dims = [0] + list(range(2, y.dim()))
    return y.float().mean(dim=dims).double()


def _mse(a: torch.Tensor, b: torch.Tensor, centered: bool) -> torch.Tensor:
    """MSE of a − b (a 0-d tensor, no sync); ``centered``: of a − b less its per-channel mean
    (the error the bias correction that follows cannot remove)."""
    d = a - b
    if centered:
        d = d - d.mean(dim=[0] + list(range(2, d.dim())), keepdim=True)
    return d.pow(2).mean()


def float_pass(fused: fx.GraphModule, mean_names: list[str], site_names: list[str], data: tuple,
               n_fit: int) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, Sites]]:
    """One forward of the float model over ``data``: the per-channel output means (fitting and
    held-out rows apart) of ``mean_names``, and for ``site_names`` (learned rounding) the
    sampled output positions with the float outputs there (a bounded number per layer)."""
    mods = layer_modules(fused)
    means: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    sites: dict[str, Sites] = {}

    def hook(name: str, mean: bool, site: bool) -> Callable:
        def h(m: nn.Module, a: tuple, y: torch.Tensor) -> None:
            if mean:
                means[name] = (_channel_mean(y[:n_fit]), _channel_mean(y[n_fit:]))
            if site:
                st = choose_sites(name, m, int(y.shape[0]), input_positions_per_row(m, a[0]), n_fit, y.device)
                st.y_fit, st.y_held = outputs_at(m, y, st.fit), outputs_at(m, y, st.held)
                sites[name] = st
        return h

    both = set(mean_names) | set(site_names)
    handles = [mods[n].register_forward_hook(hook(n, n in mean_names, n in site_names)) for n in sorted(both)]
    try:
        with torch.no_grad():
            fused(*data)
    finally:
        for h in handles:
            h.remove()
    return means, sites


def refine(fused: fx.GraphModule, records: Mapping[str, LayerRecord], data: tuple, n_fit: int,
           ranges: bool, bias: bool, rounding: bool = False,
           multipliers: tuple[float, ...] = MULTIPLIERS) -> Refined:
    """The guarded sequential pass over ``data`` (a tuple of input tensors on the model's
    device: the first ``n_fit`` rows fit, the rest are held out); ``fused`` is not changed.
    Per layer, in this order: the activation range (candidates: AMCT's scale_d × each of
    ``multipliers``, which must hold 1.0), the learned weight rounding (on the input quantized
    with the range kept), the bias correction (of the output with both)."""
    if 1.0 not in multipliers:
        raise ValueError(f"the range candidates must include AMCT's own factor (1.0), got {multipliers}")
    from amct_torch.improve.bias_correction import correctable_layers

    n_all = data[0].shape[0]
    if not 0 < n_fit < n_all:
        raise ValueError(f"refine needs fitting and held-out rows, got {n_fit} of {n_all}")
    correct = set(correctable_layers(fused, records)) if bias else set()
    fmods = layer_modules(fused)
    calls: dict[int, int] = {}
    for node in fused.graph.nodes:  # a module called from several nodes: one rounding cannot fit each
        if node.op == "call_module":
            key = id(fused.get_submodule(str(node.target)))
            calls[key] = calls.get(key, 0) + 1
    learn = sorted(n for n, r in records.items() if rounding and n in fmods and supported(fmods[n])
                   and calls.get(id(fmods[n]), 0) == 1
                   and r.scale_d is not None and r.offset_d is not None and r.scale_w)
    targets, sites = float_pass(fused, sorted(correct), learn, data, n_fit) if correct or learn else ({}, {})
    sim = copy.deepcopy(fused)
    smods = layer_modules(sim)
    st = _State(multipliers=tuple(multipliers))
    handles = []
    for name, rec in records.items():
        mod = smods.get(name)
        if mod is None or rec.scale_d is None or rec.offset_d is None:
            continue
        weighted = is_weighted(mod)
        if weighted:
            lq = layer_quant(name, mod, rec)
            mod.weight.data = torch.from_numpy(lq.fake_weight).to(mod.weight.device).reshape(mod.weight.shape)
        joint = mod.caffe_type == "Eltwise" and not rec.scale_w
        search = ranges and weighted
        learner = _Learner(fmods[name], rec.scale_w, sites[name], n_fit, name in correct) if name in sites else None
        handles.append(mod.register_forward_pre_hook(
            _pre_hook(name, float(rec.scale_d), int(rec.offset_d), joint, fmods[name] if search else None,
                      n_fit, st, centered=name in correct, learner=learner)))
        if name in correct:
            handles.append(mod.register_forward_hook(_bias_hook(name, targets[name], n_fit, st.deltas, st.berr)))
    try:
        with torch.no_grad():
            sim(*data)
    finally:
        for h in handles:
            h.remove()
    return _collect(records, st)


@dataclass
class _State:
    """What the pass's hooks leave (device tensors, read once after the pass)."""

    multipliers: tuple = MULTIPLIERS
    chosen: dict = field(default_factory=dict)
    rmse: dict = field(default_factory=dict)
    deltas: dict = field(default_factory=dict)
    berr: dict = field(default_factory=dict)
    rounding: dict = field(default_factory=dict)


class _Learner:
    """The learned rounding of one layer inside the pass: the float module (its weights and
    the sampled float outputs), the record's scale_w and the samples."""

    def __init__(self, float_mod: nn.Module, scale_w: Any, sites: Sites, n_fit: int, centered: bool) -> None:
        self.float_mod, self.scale_w, self.sites, self.n_fit, self.centered = \
            float_mod, scale_w, sites, n_fit, centered

    def __call__(self, mod: nn.Module, xq: torch.Tensor) -> Optional[tuple[Rounding, torch.Tensor]]:
        """Learn on the quantized input ``xq`` (all rows); set ``mod``'s weights to the codes
        kept and return them with the fake weights (None: the layer's budget is too small,
        ARQ's codes stay)."""
        fm, st = self.float_mod, self.sites
        assert st.y_fit is not None and st.y_held is not None
        x_fit, x_held = patches(fm, xq, st.fit), patches(fm, xq, st.held)
        w = weight_view(fm)
        s = scale_view(fm, self.scale_w)
        p, _, k = x_fit.shape
        iters = iterations(self.n_fit * st.per_row, k, int(w.shape[0] * w.shape[1]), p, k <= p)
        if iters == 0:
            return None
        r = learn_rounding(w, s, x_fit, st.y_fit, x_held, st.y_held, iters, self.centered)
        fw = fake_weight(fm, r.codes, self.scale_w)
        mod.weight.data = fw.float()
        return r, fw


def _pre_hook(name: str, scale: float, offset: int, joint: bool, float_mod: Optional[nn.Module],
              n_fit: int, st: _State, centered: bool = False, learner: Optional[_Learner] = None) -> Callable:
    """The layer's input(s) through the activation fake-quant; with ``float_mod``, the range
    search first (the winner on the fitting rows, kept if it also wins on the held-out rows);
    with ``learner``, then the learned rounding on the input so quantized."""
    scales = [to_float32(scale * m) for m in st.multipliers]
    base = st.multipliers.index(1.0)

    def hook(mod: nn.Module, args: tuple) -> tuple:
        if joint:
            return tuple(fake_quant(a, scale, offset) if isinstance(a, torch.Tensor) else a for a in args)
        x = args[0]
        rest = tuple(args[1:])
        if float_mod is None:
            xq = fake_quant(x, scale, offset)
        else:
            s_all = torch.tensor(scales, dtype=torch.float32, device=x.device)
            if supported(float_mod):
                e_base, e_k, k = _sampled_search(name, mod, float_mod, x, n_fit, scales, s_all, offset,
                                                 base, centered, learner.sites if learner is not None else None)
            else:
                e_base, e_k, k = _row_search(mod, float_mod, x, rest, n_fit, scales, s_all, offset, base,
                                             centered)
            keep = e_k < e_base
            k = torch.where(keep, k, torch.full_like(k, base))
            st.chosen[name] = k
            st.rmse[name] = torch.stack([e_base, torch.minimum(e_k, e_base)])
            xq = fake_quant(x, s_all.take(k), offset)
        if learner is not None:
            learned = learner(mod, xq)
            if learned is not None:
                st.rounding[name] = learned
        return (xq,) + rest
    return hook


def _row_search(mod: nn.Module, float_mod: nn.Module, x: torch.Tensor, rest: tuple, n_fit: int,
                scales: list, s_all: torch.Tensor, offset: int, base: int, centered: bool) -> tuple:
    """The range candidates through the layer's own forward: on the first ``SEARCH_ROWS``
    fitting rows (all candidates), the held-out rows (AMCT's factor and the winner). For the
    layers without a patch gatherer (Deconvolution)."""
    fit, held = x[:min(n_fit, SEARCH_ROWS)], x[n_fit:]
    ref_fit, ref_held = float_mod(fit), float_mod(held)
    errs = torch.stack([_mse(mod.forward(fake_quant(fit, s, offset), *rest), ref_fit, centered) for s in scales])
    k = torch.argmin(errs)
    e_base = _mse(mod.forward(fake_quant(held, scales[base], offset), *rest), ref_held, centered)
    e_k = _mse(mod.forward(fake_quant(held, s_all.take(k), offset), *rest), ref_held, centered)
    return e_base, e_k, k


def _sampled_search(name: str, mod: nn.Module, float_mod: nn.Module, x: torch.Tensor, n_fit: int,
                    scales: list, s_all: torch.Tensor, offset: int, base: int, centered: bool,
                    sites: Optional[Sites] = None) -> tuple:
    """The range candidates scored at sampled output positions (``adaround.choose_sites``: the
    same positions as the learned rounding) instead of whole rows: the layer's output there
    is patches · weights, and the activation fake-quant is elementwise (and maps the zero
    padding to zero), so fake_quant(patches(x)) = patches(fake_quant(x)) and each candidate
    costs P·K·C_out instead of a forward over rows. The bias is the same on both sides and
    drops out of the error. ``sites``: the learned rounding's, already chosen by the float pass."""
    if sites is None:
        sites = choose_sites(name, float_mod, int(x.shape[0]), input_positions_per_row(float_mod, x), n_fit,
                             x.device)
    wq, wf = weight_view(mod), weight_view(float_mod)
    fit = sites.fit[::max(1, -(-sites.fit.numel() // SEARCH_POSITIONS))]
    (pf, rf), (ph, rh) = [_patches_ref(float_mod, x, idx, wf) for idx in (fit, sites.held)]
    errs = torch.stack([_candidate_err(pf, rf, s, offset, wq, centered) for s in scales])
    k = torch.argmin(errs)
    return (_candidate_err(ph, rh, scales[base], offset, wq, centered),
            _candidate_err(ph, rh, s_all.take(k), offset, wq, centered), k)


def _patches_ref(mod: nn.Module, x: torch.Tensor, idx: torch.Tensor, wf: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The patches of ``x`` at ``idx`` and the float weights' output there (bias left out)."""
    p = patches(mod, x, idx)
    return p, apply_weights(p, wf)


def _candidate_err(p: torch.Tensor, ref: torch.Tensor, s: Any, offset: int, wq: torch.Tensor,
                   centered: bool) -> torch.Tensor:
    """Output MSE at the sampled positions with the input quantized by scale ``s``."""
    return _mse(apply_weights(fake_quant(p, s, offset), wq), ref, centered)


def _bias_hook(name: str, target: tuple[torch.Tensor, torch.Tensor], n_fit: int,
               deltas: dict, berr: dict) -> Callable:
    """δ = float mean − quantized mean on the fitting rows; kept (added to the bias and the
    output handed on) when it lowers the held-out squared mean error."""
    t_fit, t_held = target

    def hook(mod: Any, _a: tuple, y: torch.Tensor) -> torch.Tensor:
        delta = t_fit - _channel_mean(y[:n_fit])
        e = t_held - _channel_mean(y[n_fit:])
        before, after = e.pow(2).sum(), (e - delta).pow(2).sum()
        delta = torch.where(after < before, delta, torch.zeros_like(delta))
        deltas[name] = delta
        berr[name] = torch.stack([before, torch.minimum(after, before)])
        mod.bias.data += delta.to(mod.bias.dtype)
        return y + delta.to(y.dtype).reshape([1, -1] + [1] * (y.dim() - 2))
    return hook

def _collect(records: Mapping[str, LayerRecord], st: _State) -> Refined:
    """Host values, read once: the new records and the per-layer changes."""
    out = Refined(records=dict(records))
    for name, k in st.chosen.items():
        m = st.multipliers[int(k)]
        mse = st.rmse[name].cpu().tolist()
        out.changes.setdefault(name, LayerChange()).range_mse = (mse[0], mse[1])
        out.changes[name].multiplier = m
        if m != 1.0:
            rec = records[name]
            assert rec.scale_d is not None  # only calibrated layers get a range search
            out.records[name] = replace(rec, scale_d=to_float32(float(rec.scale_d) * m))
    for name, d in st.deltas.items():
        err = st.berr[name].cpu().tolist()
        ch = out.changes.setdefault(name, LayerChange())
        ch.bias_err = (err[0], err[1])
        ch.bias_kept = err[1] < err[0]
        if ch.bias_kept:
            out.bias_delta[name] = d
    for name, (r, fw) in st.rounding.items():
        vals = torch.cat([r.err.double(), r.kept.reshape(1).double()]).cpu().tolist()
        ch = out.changes.setdefault(name, LayerChange())
        ch.rounding_mse = (vals[0], vals[1])
        ch.rounding_kept = bool(vals[2])
        if ch.rounding_kept:
            out.weights[name] = fw
    return out
