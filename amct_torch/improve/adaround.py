"""Learned weight rounding (opt-in, beyond AMCT; AdaRound, Nagel et al. 2020): per weight, floor
or ceil of w/s on ARQ's grid, chosen so that the rounding errors cancel in the layer's output.

Why: ARQ's nearest rounding minimizes each weight's own error, not the output's; learning the
rounding on the data lowers the output error (often by several dB on small and depthwise
layers) while the grid, the record's scale_w, stays AMCT's, so every exporter writes the
learned integers. ``learn_rounding`` runs per layer inside ``refine.py``'s sequential pass and
keeps its codes only where they lower the output error on held-out positions. The objective,
the sampling, the cost bounds and the layers covered: docs/algorithms.md, "Improvements
beyond AMCT"."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from amct_torch.algorithms.quant import QMAX, QMIN, channel_view, quantize
from amct_torch.caffe.layers.base import canonical_axis
from amct_torch.caffe.layers.traits import is_fully_connected, is_transposed, is_weighted

#: the rectified sigmoid's stretch (AdaRound's ζ, γ)
ZETA, GAMMA = 1.1, -0.1
#: weight of the rounding regularizer against the normalized reconstruction error
LAMBDA = 1.0
#: β of the regularizer, annealed from the first to the second after the warm-up
BETA = (20.0, 2.0)
#: share of the iterations without the regularizer (the rounding moves freely first)
WARMUP = 0.2
#: Adam's step size on V (V starts within about ±2.4; a few dozen steps can cross 0)
LR = 0.05
#: fitting / held-out output positions sampled per layer, at most
MAX_POSITIONS, HELD_POSITIONS = 4096, 1024
#: floats a layer's samples may hold (positions × max(patch length, output channels))
MAX_ELEMENTS = 1 << 22
#: iterations: BUDGET × (the layer's forward multiply-adds on the fitting rows) / (one
#: iteration's), within [MIN_ITERS, MAX_ITERS]
BUDGET, MIN_ITERS, MAX_ITERS = 2.0, 50, 200

def supported(mod: Any) -> bool:
    """Whether ``mod``'s rounding can be learned: a float (not integer) Convolution of any group
    count or an InnerProduct."""
    if not is_weighted(mod) or is_transposed(mod) or getattr(mod, "integer", False):
        return False
    w = getattr(mod, "weight", None)
    if w is None:
        return False
    return is_fully_connected(mod) or w.dim() == 4


def _groups(mod: Any) -> int:
    return 1 if is_fully_connected(mod) else int(getattr(mod, "groups", 1))


@dataclass
class Sites:
    """The sampled output positions of one layer (flat indices over rows × spatial positions,
    fitting ones from the first ``n_fit`` rows, held-out ones from the rest), with the float
    model's output there (Y, [P, C_out], float bias taken off)."""

    fit: torch.Tensor
    held: torch.Tensor
    per_row: int = 1
    y_fit: Optional[torch.Tensor] = None
    y_held: Optional[torch.Tensor] = None


def input_positions_per_row(mod: Any, x: torch.Tensor) -> int:
    """Output positions of one row, from the layer's input ``x`` (the float pass and the
    range search both count them so: the same sites in each)."""
    if is_fully_connected(mod):
        return int(math.prod(x.shape[1:canonical_axis(int(getattr(mod, "axis", 1)), x.dim(), mod)]))
    h, w = _out_hw(mod, x)
    return h * w


def choose_sites(name: str, mod: Any, n_all: int, per_row: int, n_fit: int, device: torch.device) -> Sites:
    """Sampled output positions of layer ``name`` over ``n_all`` rows of ``per_row`` positions
    (a fixed seed per layer name, so the float pass and the quantized pass pick the same ones):
    all of them when few, else a uniform sample without replacement, at most ``MAX_POSITIONS``
    fitting and ``HELD_POSITIONS`` held-out ones and ``MAX_ELEMENTS`` floats of patches or
    outputs."""
    k = int(mod.weight[0].numel()) * _groups(mod)
    width = max(k, int(mod.weight.shape[0]))
    cap = max(64, MAX_ELEMENTS // max(1, width))
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def pick(lo: int, hi: int, most: int) -> torch.Tensor:
        total = (hi - lo) * per_row
        idx = torch.arange(total) if total <= most else torch.randperm(total, generator=gen)[:most].sort().values
        return (idx + lo * per_row).to(device)

    return Sites(pick(0, n_fit, min(MAX_POSITIONS, cap)), pick(n_fit, n_all, min(HELD_POSITIONS, cap)), per_row)


def outputs_at(mod: Any, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The layer output ``y`` at flat positions ``idx``, as [P, C_out], less the layer's bias."""
    if is_fully_connected(mod):
        out = y.reshape(-1, y.shape[-1])[idx]
    else:
        per = y.shape[2] * y.shape[3]
        n, r = idx // per, idx % per
        out = y[n, :, r // y.shape[3], r % y.shape[3]]
    if mod.bias is not None:
        out = out - mod.bias.detach().to(out.dtype)
    return out.float()


def _out_hw(mod: Any, x: torch.Tensor) -> tuple[int, int]:
    """A convolution's output height and width for the input ``x`` (Caffe's formula)."""
    kh, kw = mod.weight.shape[2], mod.weight.shape[3]
    (sh, sw), (ph, pw), (dh, dw) = mod.stride, mod.padding, mod.dilation
    return ((x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1,
            (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


def patches(mod: Any, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The layer's input patches at flat output positions ``idx``: [P, groups, K] with K in
    the weight's own order (C_in/g, kh, kw), so that patch · weight row = the output."""
    if is_fully_connected(mod):
        ax = canonical_axis(int(getattr(mod, "axis", 1)), x.dim(), mod)
        return x.reshape(-1, int(math.prod(x.shape[ax:])))[idx].float().unsqueeze(1)
    kh, kw = mod.weight.shape[2], mod.weight.shape[3]
    (sh, sw), (ph, pw), (dh, dw) = mod.stride, mod.padding, mod.dilation
    h_out, w_out = _out_hw(mod, x)
    xp = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    per = h_out * w_out
    n, r = idx // per, idx % per
    hi = (r // w_out).unsqueeze(1) * sh + torch.arange(kh, device=x.device) * dh   # [P, kh]
    wi = (r % w_out).unsqueeze(1) * sw + torch.arange(kw, device=x.device) * dw    # [P, kw]
    p = xp[n[:, None, None], :, hi[:, :, None], wi[:, None, :]]                     # [P, kh, kw, C]
    g = _groups(mod)
    return p.permute(0, 3, 1, 2).reshape(idx.numel(), g, -1).float()


def weight_view(mod: Any) -> torch.Tensor:
    """The layer's weight as [groups, C_out/g, K] (rows in output-channel order)."""
    w = mod.weight.detach().float()
    g = _groups(mod)
    return w.reshape(g, w.shape[0] // g, -1)


def iterations(rows_positions: int, k: int, c_out: int, positions: int, gram: bool) -> int:
    """The iteration budget of a layer: ``BUDGET`` × its forward multiply-adds over the
    fitting rows (``rows_positions`` output positions, each K·C_out) divided by one
    iteration's (Gram: C_out·K², one product; direct: 2·P·K·C_out, the prediction and the
    gradient), at most ``MAX_ITERS``; 0 (the layer keeps ARQ's rounding) when that is below
    ``MIN_ITERS``: too few steps to move the rounding, and a layer this costly per step
    (a large K over few positions) would dominate the run."""
    forward = rows_positions * k * c_out
    per_iter = c_out * k * k if gram else 2 * positions * k * c_out
    n = int(min(MAX_ITERS, BUDGET * forward / max(1, per_iter)))
    return n if n >= MIN_ITERS else 0


@dataclass
class Rounding:
    """One layer's result (device tensors): the codes kept ([groups, C_out/g, K], float holding
    integers; the learned ones where ``kept``), and the held-out output error (MSE) with ARQ's
    nearest codes and with the codes kept."""

    codes: torch.Tensor
    kept: torch.Tensor
    err: torch.Tensor


def _center(t: torch.Tensor) -> torch.Tensor:
    return t - t.mean(dim=0, keepdim=True)


def apply_weights(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The layer's output (bias left out) from its patches: x [P, g, K] · w [g, o, K] per
    group, as [P, g·o] (output channels in order)."""
    return torch.einsum("pgk,gok->pgo", x, w).reshape(x.shape[0], -1)


def _sse(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ (x·wᵀ − y)² per group; x [P, g, K], w [g, o, K], y [P, g·o]."""
    return (apply_weights(x, w) - y).pow(2).sum()


def learn_rounding(w: torch.Tensor, scale: torch.Tensor, x_fit: torch.Tensor, y_fit: torch.Tensor,
                   x_held: torch.Tensor, y_held: torch.Tensor, iters: int, centered: bool = False) -> Rounding:
    """Learn the rounding of ``w`` ([g, o, K], float) on the grid ``scale`` ([g, o, 1] or
    broadcastable) from the fitting patches ``x_fit`` [P, g, K] and float outputs ``y_fit``
    [P, g·o]; keep it only where the held-out error (``x_held``, ``y_held``) is lower than with
    the nearest codes. No host read."""
    x_fit, y_fit, x_held, y_held = x_fit.float(), y_fit.float(), x_held.float(), y_held.float()
    if centered:
        x_fit, y_fit, x_held, y_held = _center(x_fit), _center(y_fit), _center(x_held), _center(y_held)
    ws = w / scale
    nearest = quantize(w, scale).float()              # ARQ's codes, as the exporters compute them
    base = torch.floor(ws)
    rest = ws - base
    alive = nearest.ne(0).any(dim=-1, keepdim=True)   # a channel of zero codes stays zero
    free = (rest > 0) & (nearest.abs() < QMAX) & alive   # the extremes (±127, −128) stay
    p, g, k = x_fit.shape
    gram = k <= p
    if gram:  # Σ(xw − y)² = Σ_c wᵀGw − 2wᵀb + yᵀy: its gradient 2(wG − b), o·K² per group
        gmat = torch.einsum("pgk,pgl->gkl", x_fit, x_fit)
        bmat = torch.einsum("pgk,pgo->gok", x_fit, y_fit.reshape(p, g, -1))

        def grad_w(wt: torch.Tensor) -> torch.Tensor:
            return 2 * (torch.matmul(wt, gmat) - bmat)
    else:
        def grad_w(wt: torch.Tensor) -> torch.Tensor:
            r = torch.einsum("pgk,gok->pgo", x_fit, wt) - y_fit.reshape(p, g, -1)
            return 2 * torch.einsum("pgo,pgk->gok", r, x_fit)
    norm = _sse(x_fit, nearest * scale, y_fit).clamp_min(1e-30)
    target = ((rest - GAMMA) / (ZETA - GAMMA)).clamp(1e-4, 1 - 1e-4)
    v = torch.where(free, torch.log(target / (1 - target)), torch.zeros_like(rest))
    m1, m2 = torch.zeros_like(v), torch.zeros_like(v)
    warm = int(iters * WARMUP)
    # free elements have |nearest| < 127, so floor(w/s) + h stays within [-127, 127]: no clamp
    fixed = torch.where(free, base, nearest) * scale   # the weight with h = 0 where free
    free_s = free.float() * scale                       # dW/dh
    dq_ds = (ZETA - GAMMA) * free_s / norm              # dLoss_rec/dW · dW/dh · dh/dσ, less σ'
    reg_w = (ZETA - GAMMA) * LAMBDA / free.sum().clamp_min(1) * free.float()
    for t in range(1, iters + 1):
        # the gradient by hand (no autograd graph: one product per iteration on the Gram path)
        sig = torch.sigmoid(v)
        raw = sig * (ZETA - GAMMA) + GAMMA
        h = raw.clamp(0.0, 1.0)
        dq = grad_w(torch.addcmul(fixed, h, free_s)) * dq_ds
        if t > warm:
            frac = (t - warm) / max(1, iters - warm)
            beta = BETA[1] + 0.5 * (BETA[0] - BETA[1]) * (1 + math.cos(math.pi * frac))
            u = 2 * h - 1  # d/dh (1 − |u|^β) = −2β·|u|^(β−1)·sign(u)
            dq = dq - (2 * beta) * reg_w * u.abs().pow(beta - 1) * torch.sign(u)
        # σ' = σ(1 − σ), zero where the rectified sigmoid is clamped
        grad = torch.where((raw > 0) & (raw < 1), dq * sig * (1 - sig), 0.0)
        m1.mul_(0.9).add_(grad, alpha=0.1)
        m2.mul_(0.999).addcmul_(grad, grad, value=0.001)
        step = LR * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        v = v.addcdiv_(m1, m2.sqrt().add_(1e-8), value=-step)
    learned = torch.where(free, (base + (v >= 0).float()).clamp(QMIN, QMAX), nearest)
    e_near = _sse(x_held, nearest * scale, y_held)
    e_learn = _sse(x_held, learned * scale, y_held)
    kept = e_learn < e_near
    codes = torch.where(kept, learned, nearest)
    count = max(1, y_held.numel())
    return Rounding(codes, kept, torch.stack([e_near, torch.minimum(e_learn, e_near)]) / count)


def scale_view(mod: Any, scale_w: Any) -> torch.Tensor:
    """The record's scale_w of ``mod`` as [groups, C_out/g, 1] (a per-tensor value broadcast)."""
    s = torch.as_tensor(scale_w, dtype=torch.float32, device=mod.weight.device).reshape(-1)
    g = _groups(mod)
    c_out = int(mod.weight.shape[0])
    if s.numel() == 1:
        s = s.expand(c_out)
    return s.reshape(g, c_out // g, 1)


def fake_weight(mod: Any, codes: torch.Tensor, scale_w: Any) -> torch.Tensor:
    """codes · scale_w in the module's weight layout (float32): the weights to store, which the
    exporters' clamp(round(w/s)) turns back into ``codes`` exactly."""
    s = torch.as_tensor(scale_w, dtype=torch.float32, device=mod.weight.device).reshape(-1)
    shape = tuple(mod.weight.shape)
    codes_l = codes.reshape(shape)
    return codes_l * channel_view(s, shape, mod.caffe_type, _groups(mod))
