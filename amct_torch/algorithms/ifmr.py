"""IFMR activation calibration (SPEC §5.2) as pure tensor functions.

Two ways to get each candidate's loss, one search:

* ``ifmr_exact`` — AMCT's definition: order statistics of all the data and the loss summed
  over every element. All candidates are evaluated together on [candidates, chunk] blocks
  (chunked to bound memory); no Python loop over candidates, no host sync until the result.
* ``ifmr_from_histogram`` — the memory-bounded (streaming) variant: the init clip comes from
  exact top-k/bottom-k buffers (histogram quantile when k exceeds them) and the losses from a
  fine histogram that keeps, per bin, the count and the sum of offsets inside the bin (so bins
  that do not straddle a rounding boundary contribute their exact loss up to a constant).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from amct_torch.algorithms.quant import FLT_EPS

#: elements of one [candidates, chunk] block of the exact search (bounds its memory)
EXACT_BLOCK = 1 << 20


@dataclass
class IfmrResult:
    """Outcome of a search: ``scale``/``offset`` are the factors; ``index`` the chosen
    candidate, ``ratio`` its ratio, ``losses`` every candidate's loss (sum, float64, for the
    histogram path up to a constant shared by all candidates)."""

    scale: float
    offset: int
    index: int
    ratio: float
    max_init: float
    min_init: float
    losses: torch.Tensor


def num_candidates(start: float, end: float, step: float) -> int:
    """n = int((end − start)/step + 1) computed in float32 (0.7, 1.3, 0.01 → 60)."""
    s, e, st = np.float32(start), np.float32(end), np.float32(step)
    return int((e - s) / st + np.float32(1))


def candidate_ratios(start: float, end: float, step: float, device=None) -> torch.Tensor:
    """ratio_i = start + i·step in float32, i = 0 … n−1."""
    n = num_candidates(start, end, step)
    i = torch.arange(n, dtype=torch.float32, device=device)
    return torch.tensor(start, dtype=torch.float32, device=device) + i * torch.tensor(step, dtype=torch.float32, device=device)


def percentile_k(length: int, p: float) -> int:
    """k of the k-th largest (p = max_percentile) / smallest: 1 if |p − 1| < FLT_EPS else
    L − floor(p·L) (in float64, as Python computes it), at least 1."""
    if abs(p - 1.0) < FLT_EPS:
        return 1
    return max(1, length - math.floor(p * length))


def kth_largest(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-th largest element of the flat tensor ``x`` as a 0-d tensor (no host sync)."""
    n = x.numel()
    if k <= 4096:
        return torch.topk(x, k, sorted=True).values[k - 1]
    return torch.kthvalue(x.cpu() if x.device.type == "mps" else x, n - k + 1).values.to(x.device)


def kth_smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-th smallest element of the flat tensor ``x`` as a 0-d tensor."""
    if k <= 4096:
        return torch.topk(x, k, largest=False, sorted=True).values[k - 1]
    return torch.kthvalue(x, k).values


def candidate_grid(max_init: torch.Tensor, min_init: torch.Tensor, ratios: torch.Tensor,
                   asymmetric: bool):
    """Clip bounds and scales of every candidate (SPEC §5.2 step 3), float32 tensors [n]:
    returns (lo, hi, scale). Scales below FLT_EPS become 1.0."""
    zero = torch.zeros((), dtype=torch.float32, device=ratios.device)
    max_init = torch.maximum(max_init.float(), zero)
    min_init = torch.minimum(min_init.float(), zero)
    if asymmetric:
        hi = ratios * max_init
        s = (hi - min_init) / 255
        lo = min_init.expand_as(hi)
    else:
        positive = max_init > -min_init
        mag = torch.where(positive, max_init, -min_init)
        hi = ratios * mag
        s = hi / torch.where(positive, 127.0, 128.0)
        lo = -hi
    s = torch.where(s < FLT_EPS, torch.ones_like(s), s)
    return lo, hi, s


def exact_losses(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, s: torch.Tensor,
                 block: int = EXACT_BLOCK) -> torch.Tensor:
    """Σ (round(clip(x, lo_i, hi_i)/s_i)·s_i − x)² for every candidate i, float64 [n].

    Elementwise maths in float32 (as the definition), per-block sums in float64. Zeros are
    skipped by the caller (their error is exactly 0 for every candidate)."""
    n = lo.numel()
    hi_c, s_c = hi[:, None], s[:, None]
    lo_c = lo[:, None] if lo.numel() > 1 and not asymmetric_lo(lo) else None
    total = torch.zeros(n, dtype=torch.float64, device=x.device)
    chunk = max(1, min(block // max(n, 1), x.numel()))
    work = torch.empty((n, chunk), dtype=torch.float32, device=x.device)  # reused: no page faults
    col = torch.empty(chunk, dtype=torch.float32, device=x.device)
    for start in range(0, x.numel(), chunk):
        xc = x[start:start + chunk]
        m = xc.numel()
        t = work[:, :m]
        if lo_c is None:  # one lower bound for all candidates: clamp once, then minimum
            c = torch.clamp(xc, min=lo[0], out=col[:m])
            torch.minimum(c.unsqueeze(0), hi_c, out=t)
        else:
            torch.maximum(xc.unsqueeze(0), lo_c, out=t)
            torch.minimum(t, hi_c, out=t)
        t.div_(s_c).round_().mul_(s_c).sub_(xc)
        total += torch.linalg.vecdot(t, t, dim=1).double()
    return total


def asymmetric_lo(lo: torch.Tensor) -> bool:
    """True when every candidate shares the lower clip (the asymmetric search): the lower
    clamp is then done once per element instead of once per candidate (a stride-0 view)."""
    return lo.numel() > 0 and lo.stride(0) == 0


def finish(losses: torch.Tensor, ratios: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
           s: torch.Tensor, max_init: torch.Tensor, min_init: torch.Tensor,
           asymmetric: bool) -> IfmrResult:
    """First argmin → factors (SPEC §5.2 step 4); the only host sync of a search."""
    idx = torch.argmin(losses)
    scale = s[idx]
    if asymmetric:
        offset = -torch.round(torch.minimum(min_init.float(), torch.zeros_like(scale)) / scale) - 128
    else:
        offset = torch.zeros_like(scale)
    vals = torch.stack([idx.to(torch.float64), scale.double(), offset.double(), ratios[idx].double(),
                        max_init.double(), min_init.double()]).tolist()
    return IfmrResult(scale=vals[1], offset=int(vals[2]), index=int(vals[0]), ratio=vals[3],
                      max_init=max(vals[4], 0.0), min_init=min(vals[5], 0.0), losses=losses)


def ifmr_exact(x: torch.Tensor, max_percentile: float = 0.999999, min_percentile: float = 0.999999,
               search_range: Sequence[float] = (0.7, 1.3), search_step: float = 0.01,
               asymmetric: bool = True, block: int = EXACT_BLOCK) -> IfmrResult:
    """IFMR on all the data ``x`` (any shape; computed in float32 on x's device)."""
    x = x.detach().reshape(-1).float()
    n = x.numel()
    mx = kth_largest(x, min(percentile_k(n, max_percentile), n))
    mn = kth_smallest(x, min(percentile_k(n, min_percentile), n))
    ratios = candidate_ratios(search_range[0], search_range[1], search_step, x.device)
    lo, hi, s = candidate_grid(mx, mn, ratios, asymmetric)
    nz = x[x != 0]
    losses = exact_losses(nz, lo, hi, s, block)
    return finish(losses, ratios, lo, hi, s, mx, mn, asymmetric)


def histogram_losses(bin_lo: torch.Tensor, width: float, counts: torch.Tensor, dsum: torch.Tensor,
                     lo: torch.Tensor, hi: torch.Tensor, s: torch.Tensor,
                     block: int = 1 << 20) -> torch.Tensor:
    """Loss of every candidate from a histogram, float64 [n], up to a constant shared by all
    candidates (Σx² over the data, which the histogram does not keep).

    Bin b covers [bin_lo_b, bin_lo_b + width) (a uniform grid: bin_lo_b = bin_lo_0 + b·width) and holds ``counts``
    elements whose offsets from bin_lo sum to ``dsum`` (absolute units). Every element of one
    quantization level j (value q_j) adds (q_j − x)², so a candidate's loss is
    Σ_j q_j²·N_j − 2·q_j·S_j + Σx², with N_j, S_j the count and first moment of the data
    between two rounding boundaries. Those come from prefix sums over the bins, read at each
    boundary; inside the bin holding a boundary the density is taken as uniform. Clipping needs
    no special case: everything below the first boundary rounds to the lowest level and
    everything above the last one to the highest. Cost O(candidates × levels), not × bins.
    ``block`` is unused (kept for callers of the former per-bin evaluation).
    """
    dev = bin_lo.device
    n_b = counts.double()
    first = n_b * bin_lo.double() + dsum.double()           # Σx per bin
    zero = torch.zeros(1, dtype=torch.float64, device=dev)
    cum_n = torch.cat([zero, n_b.cumsum(0)])                  # count of bins < b, length nbins+1
    cum_s = torch.cat([zero, first.cumsum(0)])
    s64 = s.double()[:, None]
    m_lo = torch.round(lo.double()[:, None] / s64)            # lowest and highest level index
    m_hi = torch.round(hi.double()[:, None] / s64)
    k = (m_hi - m_lo).clamp_(min=0)                          # boundaries per candidate
    n_bound = int(k.max()) if k.numel() else 0
    j = torch.arange(n_bound + 1, dtype=torch.float64, device=dev)[None, :]
    t = torch.where(j < k, (m_lo + j + 0.5) * s64, torch.full_like(s64, math.inf))
    # value of the prefix sums at t: bins wholly below plus the uniform share of t's bin
    start = bin_lo[:1].double()
    b = torch.floor((t - start) / width).clamp_(0, n_b.numel() - 1).long()
    a = start + b.double() * width
    f = ((t - a) / width).clamp_(0.0, 1.0)
    nb = n_b[b]
    past = f >= 1.0                                           # beyond the last bin: the totals
    cnt_at = torch.where(past, cum_n[b + 1], cum_n[b] + nb * f)
    sum_at = torch.where(past, cum_s[b + 1], cum_s[b] + nb * f * (a + f * (0.5 * width)))
    n_lvl = torch.diff(cnt_at, dim=1, prepend=torch.zeros_like(s64))
    s_lvl = torch.diff(sum_at, dim=1, prepend=torch.zeros_like(s64))
    q = (m_lo + j) * s64
    return (q * (q * n_lvl - 2.0 * s_lvl)).sum(dim=1)


def histogram_quantile_top(bin_lo: torch.Tensor, width: float, counts: torch.Tensor, k: int) -> torch.Tensor:
    """Approximate k-th largest value from a histogram (uniform density inside the bin)."""
    rc = torch.flip(counts, [0]).cumsum(0)
    j = torch.searchsorted(rc, torch.tensor([k], dtype=rc.dtype, device=rc.device))[0].clamp(max=counts.numel() - 1)
    b = counts.numel() - 1 - j
    before = torch.where(j > 0, rc[(j - 1).clamp(min=0)], torch.zeros_like(rc[0]))
    inside = (k - before).double() / counts[b].double().clamp(min=1)
    return (bin_lo[b] + width * (1 - inside + 0.5 / counts[b].double().clamp(min=1))).float()


def histogram_quantile_bottom(bin_lo: torch.Tensor, width: float, counts: torch.Tensor, k: int) -> torch.Tensor:
    """Approximate k-th smallest value from a histogram."""
    cc = counts.cumsum(0)
    b = torch.searchsorted(cc, torch.tensor([k], dtype=cc.dtype, device=cc.device))[0].clamp(max=counts.numel() - 1)
    before = torch.where(b > 0, cc[(b - 1).clamp(min=0)], torch.zeros_like(cc[0]))
    inside = (k - before).double() / counts[b].double().clamp(min=1)
    return (bin_lo[b] + width * (inside - 0.5 / counts[b].double().clamp(min=1))).float()


def ifmr_from_histogram(length: int, top: torch.Tensor, bottom: torch.Tensor, bin_lo: torch.Tensor,
                        width: float, counts: torch.Tensor, dsum: torch.Tensor,
                        max_percentile: float = 0.999999, min_percentile: float = 0.999999,
                        search_range: Sequence[float] = (0.7, 1.3), search_step: float = 0.01,
                        asymmetric: bool = True) -> IfmrResult:
    """IFMR from streaming statistics: ``length`` elements seen, ``top`` the largest values
    sorted descending (exact, −inf padded), ``bottom`` the smallest ascending, and the
    histogram (``bin_lo`` float64 bin starts, common ``width``, ``counts``, ``dsum``)."""
    k_max = percentile_k(length, max_percentile)
    k_min = percentile_k(length, min_percentile)
    mx = top[k_max - 1] if k_max <= top.numel() else histogram_quantile_top(bin_lo, width, counts, k_max)
    mn = bottom[k_min - 1] if k_min <= bottom.numel() else histogram_quantile_bottom(bin_lo, width, counts, k_min)
    ratios = candidate_ratios(search_range[0], search_range[1], search_step, top.device)
    lo, hi, s = candidate_grid(mx, mn, ratios, asymmetric)
    losses = histogram_losses(bin_lo, width, counts, dsum, lo, hi, s)
    # the histogram losses are estimates: candidates within a hair of the best (relative to
    # the size of one quantization error, n·s²/12) are ties, and the first of them wins
    tol = 1e-6 * float(length) * (s.double().min() ** 2) / 12
    first = torch.nonzero(losses <= losses.min() + tol)[0, 0]
    tied = torch.full_like(losses, float("inf"))
    tied[first] = losses[first]
    r = finish(tied, ratios, lo, hi, s, mx, mn, asymmetric)
    r.losses = losses
    return r
