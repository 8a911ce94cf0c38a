"""IFMR activation calibration (docs/algorithms.md, "IFMR") as pure tensor functions.

Two ways to get each candidate's loss, one search: ``ifmr_exact`` (AMCT's definition: order
statistics of all the data, every candidate evaluated at once on chunked [candidates, chunk]
blocks, no host sync until the result) and ``ifmr_from_histogram`` (the memory-bounded streaming
variant: the initial clip from exact top-k/bottom-k buffers, the losses from a fine histogram
that keeps per bin the count and the sum of offsets, exact for bins that do not straddle a
rounding boundary)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from amct_torch.algorithms.quant import FLT_EPS
from amct_torch.algorithms.select import extreme_values

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
    return (torch.tensor(start, dtype=torch.float32, device=device)
            + i * torch.tensor(step, dtype=torch.float32, device=device))


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
        return extreme_values(x, k, largest=True)[k - 1]
    return torch.kthvalue(x.cpu() if x.device.type == "mps" else x, n - k + 1).values.to(x.device)


def kth_smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-th smallest element of the flat tensor ``x`` as a 0-d tensor."""
    if k <= 4096:
        return extreme_values(x, k, largest=False)[k - 1]
    return torch.kthvalue(x, k).values


def candidate_grid(max_init: torch.Tensor, min_init: torch.Tensor, ratios: torch.Tensor,
                   asymmetric: bool):
    """Clip bounds and scales of every candidate (IFMR step 3), float32 tensors [n]:
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


def level_thresholds(lo: torch.Tensor, hi: torch.Tensor, s: torch.Tensor):
    """Exact level edges of every candidate: (levels, thresholds, valid, ok).

    An element's level is round(clip(x, lo, hi)/s) in float32 (IFMR step 3) — a monotone step
    function of x, so each level is an interval of x. ``levels`` [n, m] are the integer levels
    j_lo … j_hi of each candidate (padded rows repeat nothing: ``valid`` marks real entries);
    ``thresholds`` [n, m−1] holds, for level j, the smallest float32 T whose level exceeds j,
    so the elements of level j are exactly those with T_{j−1} ≤ x < T_j. T is found bit-exactly
    by evaluating the very float32 expression on the ±4-ulp neighbourhood of (j + ½)·s (the
    true edge is within about one ulp of it); ``ok`` (0-d bool) is False if some edge was not
    bracketed by that window (then the caller takes the brute-force path)."""
    dev = s.device
    lo_c, hi_c, s_c = lo[:, None], hi[:, None], s[:, None]
    j_lo = torch.round(lo / s)                                   # level of everything ≤ lo
    j_hi = torch.round(hi / s)
    count = (j_hi - j_lo).clamp_(min=0)                          # thresholds per candidate
    m = int(count.max()) if count.numel() else 0                 # ≤ 257: a host read of the grid only
    step = torch.arange(max(m, 1), dtype=torch.float32, device=dev)[None, :]
    level = j_lo[:, None] + step                                 # the level below each edge
    valid = step < count[:, None]
    guess = ((level.double() + 0.5) * s_c.double()).float()
    guess = torch.where(valid, guess, lo_c.expand_as(guess))
    # window of neighbouring floats around the guess: guess ± k ulps, k = −4 … 4
    win = [guess]
    up, down = guess, guess
    for _ in range(4):
        up = torch.nextafter(up, torch.full_like(up, math.inf))
        down = torch.nextafter(down, torch.full_like(down, -math.inf))
        win.append(up)
        win.insert(0, down)
    w = torch.stack(win, dim=-1)                                 # [n, m, 9] ascending
    above = (torch.round(torch.minimum(torch.maximum(w, lo_c[..., None]), hi_c[..., None]) / s_c[..., None])
             > level[..., None])
    first = torch.argmax(above.to(torch.uint8), dim=-1)          # first float whose level > j
    thr = torch.gather(w, -1, first[..., None])[..., 0]
    bracketed = above[..., -1] & ~above[..., 0]
    ok = torch.all(bracketed | ~valid)
    thr = torch.where(valid, thr, torch.full_like(thr, math.inf))
    return level, thr, valid, ok


def boundary_losses(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, s: torch.Tensor,
                    bins: int = 0):
    """(losses, ok): the same losses as :func:`exact_losses` (float64 [n]) without touching every
    element–candidate pair: O(N + candidates × levels).

    Each candidate's loss is Σ_j Σ_{x in level j} (q_j − x)² = Σx² + Σ_j q_j(q_j·N_j − 2·S_j),
    q_j = float32(j·s), with N_j and S_j the count and sum of the elements in level j. Those
    come from the counts and sums of elements below each exact level edge T (see
    :func:`level_thresholds`): the data are binned once on a uniform float32 grid spanning the
    edges (bin(x) monotone in x, computed by the same expression for data and edges, so bins
    below bin(T) hold only elements < T and bins above only elements > T); the few bins that
    hold an edge are gathered, sorted and searched exactly, the others enter through prefix
    sums. Counts are exact; sums float64 — the same set of elements per level as the
    element-wise definition, the arithmetic differs only by float64 rounding."""
    x = x.reshape(-1)
    n_el = x.numel()
    dev = x.device
    level, thr, valid, ok = level_thresholds(lo, hi, s)
    xd = x.double()
    total_sq = torch.dot(xd, xd)
    nb = bins or min(max(n_el // 4, 1 << 10), 1 << 19)  # measured: ~4 elements a bin, ≤ 4 MB of bins
    big = torch.tensor(3.0e38, dtype=torch.float32, device=dev)
    finite_thr = torch.where(valid, thr, torch.zeros_like(thr))
    a = torch.where(valid, thr, big).min()
    b = torch.where(valid, thr, -big).max()
    a = torch.where(a > b, torch.zeros_like(a), a)               # no edges at all
    span = (b - a).clamp_min(torch.finfo(torch.float32).tiny)
    r = (torch.tensor(float(nb), dtype=torch.float32, device=dev) / span).clamp(max=3.0e38)

    def bin_of(v: torch.Tensor) -> torch.Tensor:
        # underflow bin 0, grid bins 1 … nb, overflow bin nb + 1; monotone in v (the value is
        # ≥ 0 after the clamp and shift, so the integer conversion's truncation is a floor)
        return ((v - a).mul_(r).clamp_(-1, nb).add_(1)).to(torch.int32)

    idx = bin_of(x)
    t_idx = torch.where(valid, bin_of(finite_thr), torch.full_like(idx[:1], nb + 2).expand_as(thr)).long()
    flat_t = t_idx.reshape(-1)
    edge_bin = torch.zeros(nb + 3, dtype=torch.uint8, device=dev)  # uint8: the fastest gather
    edge_bin[flat_t] = 1
    g = torch.sort(x[torch.index_select(edge_bin, 0, idx).view(torch.bool)]).values  # edge-bin elements
    counts = torch.bincount(idx, minlength=nb + 3)
    sums = torch.bincount(idx, weights=xd, minlength=nb + 3)
    total_s = sums.sum()
    counts[flat_t] = 0                                           # edge bins: counted via g
    sums[flat_t] = 0
    # an edge bin is zeroed, so the inclusive prefix at it equals the prefix of bins below it
    cum_n = counts.cumsum_(0)
    cum_s = sums.cumsum_(0)
    zero64 = torch.zeros(1, dtype=torch.float64, device=dev)
    cum_g = torch.cat([zero64, g.double().cumsum(0)])
    pos = torch.searchsorted(g, thr.contiguous())
    n_below = torch.where(valid, (cum_n[t_idx] + pos).double(), torch.full_like(cum_g[:1], n_el).expand_as(thr))
    s_below = torch.where(valid, cum_s[t_idx] + cum_g[pos], total_s.expand_as(thr))
    # level j: between edge j−1 (or −∞) and edge j (or +∞); one more level than edges
    full_n = torch.full_like(n_below[:, :1], n_el)
    full_s = total_s.expand_as(full_n)
    n_hi = torch.cat([n_below, full_n], dim=1)
    s_hi = torch.cat([s_below, full_s], dim=1)
    n_lvl = torch.diff(n_hi, dim=1, prepend=torch.zeros_like(full_n))
    s_lvl = torch.diff(s_hi, dim=1, prepend=torch.zeros_like(full_n))
    last = level[:, -1:] + 1
    lv = torch.cat([level, last], dim=1)
    q = (lv * s[:, None]).double()
    part = (q * (q * n_lvl - 2.0 * s_lvl)).sum(dim=1)
    return total_sq + part, ok


def asymmetric_lo(lo: torch.Tensor) -> bool:
    """True when every candidate shares the lower clip (the asymmetric search): the lower
    clamp is then done once per element instead of once per candidate (a stride-0 view)."""
    return lo.numel() > 0 and lo.stride(0) == 0


def finish(losses: torch.Tensor, ratios: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
           s: torch.Tensor, max_init: torch.Tensor, min_init: torch.Tensor,
           asymmetric: bool) -> IfmrResult:
    """First argmin → factors (IFMR step 4); the only host sync of a search."""
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
    """IFMR on all the data ``x`` (any shape; computed in float32 on x's device).

    On the CPU the losses come from the per-level boundary sums (``boundary_losses``: a few
    host reads, ~9× faster than a loop over candidates); on an accelerator from the batched
    element-wise pass (``exact_losses``), which needs no host sync inside the search."""
    x = x.detach().reshape(-1).float()
    n = x.numel()
    mx = kth_largest(x, min(percentile_k(n, max_percentile), n))
    mn = kth_smallest(x, min(percentile_k(n, min_percentile), n))
    ratios = candidate_ratios(search_range[0], search_range[1], search_step, x.device)
    lo, hi, s = candidate_grid(mx, mn, ratios, asymmetric)
    if x.device.type != "cpu":
        return finish(exact_losses(x, lo, hi, s, block), ratios, lo, hi, s, mx, mn, asymmetric)
    losses, ok = boundary_losses(x, lo, hi, s)
    if not bool(ok):  # an edge outside its ±4-ulp window (not expected): element-wise path
        losses = exact_losses(x[x != 0], lo, hi, s, block)
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
    s64, m_lo, k = (t[:, None] for t in level_ranges(lo, hi, s))
    n_b = counts.double()
    first = n_b * bin_lo.double() + dsum.double()           # Σx per bin
    zero = torch.zeros(1, dtype=torch.float64, device=dev)
    cum_n = torch.cat([zero, n_b.cumsum(0)])                  # count of bins < b, length nbins+1
    cum_s = torch.cat([zero, first.cumsum(0)])
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


def level_ranges(lo: torch.Tensor, hi: torch.Tensor, s: torch.Tensor):
    """(step, lowest level, boundaries) of every candidate, float64 [n] each: the levels run
    from round(lo/s) to round(hi/s), with one rounding boundary between neighbours."""
    s64 = s.double()
    m_lo = torch.round(lo.double() / s64)
    return s64, m_lo, (torch.round(hi.double() / s64) - m_lo).clamp_(min=0)


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
                        asymmetric: bool = True, losses_fn: Optional[Callable] = None) -> IfmrResult:
    """IFMR from streaming statistics: ``length`` elements seen, ``top`` the largest values
    sorted descending (exact, −inf padded), ``bottom`` the smallest ascending, and the
    histogram (``bin_lo`` float64 bin starts, common ``width``, ``counts``, ``dsum``).
    ``losses_fn``: a faster twin of ``histogram_losses`` with its signature (an accelerator's;
    default the torch formula)."""
    k_max = percentile_k(length, max_percentile)
    k_min = percentile_k(length, min_percentile)
    mx = top[k_max - 1] if k_max <= top.numel() else histogram_quantile_top(bin_lo, width, counts, k_max)
    mn = bottom[k_min - 1] if k_min <= bottom.numel() else histogram_quantile_bottom(bin_lo, width, counts, k_min)
    ratios = candidate_ratios(search_range[0], search_range[1], search_step, top.device)
    lo, hi, s = candidate_grid(mx, mn, ratios, asymmetric)
    losses = (losses_fn or histogram_losses)(bin_lo, width, counts, dsum, lo, hi, s)
    # the histogram losses are estimates: candidates within a hair of the best (relative to
    # the size of one quantization error, n·s²/12) are ties, and the first of them wins
    tol = 1e-6 * float(length) * (s.double().min() ** 2) / 12
    first = torch.nonzero(losses <= losses.min() + tol)[0, 0]
    tied = torch.full_like(losses, float("inf"))
    tied[first] = losses[first]
    r = finish(tied, ratios, lo, hi, s, mx, mn, asymmetric)
    r.losses = losses
    return r
