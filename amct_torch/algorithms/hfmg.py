"""HFMG activation calibration (docs/algorithms.md, "HFMG") as tensor functions.

Histogram build and the sequential merge rule, the greedy candidate ranges, the analytic L2
loss of every candidate (one batched tensor evaluation), and the factors.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from amct_torch.algorithms.histogram import count_bins
from amct_torch.algorithms.quant import FLT_EPS, to_float32

DST_BINS = 256


def bin_width(mn: float, mx: float, nbins: int) -> float:
    """Width of one bin of [mn, mx] as float32 (the value the data is binned with)."""
    return to_float32((mx - mn) / nbins)


def histogram(x: torch.Tensor, mn: float, mx: float, nbins: int) -> torch.Tensor:
    """int64 counts of flat float32 ``x`` over [mn, mx]: bin = min(floor((x − mn)/w), nbins−1)
    with w = float32((mx − mn)/nbins), all computed in float32; mn == mx → the middle bin.
    (Host-side range; the observers' sync-free form is ``histogram_in_range``.)"""
    dev = x.device
    return histogram_in_range(x, torch.tensor(mn, dtype=torch.float64, device=dev),
                              torch.tensor(mx, dtype=torch.float64, device=dev), nbins)


def histogram_in_range(x: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor, nbins: int) -> torch.Tensor:
    """``histogram`` with the range as 0-d float64 device tensors: no host read. Bins are
    clamped to [0, nbins) so that NaN/Inf (flagged by the caller) cannot index outside."""
    w = ((mx - mn) / nbins).float()
    t = torch.sub(x, mn.float())
    t.div_(w)
    idx = t.to(torch.int32).clamp_(0, nbins - 1)
    idx = torch.where(w > 0, idx, torch.full_like(idx, nbins // 2))
    return count_bins(idx, nbins)


def update(counts: torch.Tensor, rng: torch.Tensor, seen: torch.Tensor,
           x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of the sequential rule (HFMG step 1) in tensor ops, no host read: the
    histogram (int64 [nbins]) of [mn, mx] (``rng`` float64 [2]) grows to the union with the
    batch's range (old counts redistributed, ``redistribute``), then the batch is added.
    ``seen``: 0-d bool, false before the first batch (the range is then the batch's).
    Returns the new (counts, rng) and a 0-d bool: the batch held NaN or Inf (every index
    stays in bounds; the caller raises when factors are asked)."""
    lo, hi = torch.aminmax(x)
    lo, hi = lo.double(), hi.double()
    nmn = torch.where(seen, torch.minimum(rng[0], lo), lo)
    nmx = torch.where(seen, torch.maximum(rng[1], hi), hi)
    moved = redistribute_in_range(counts, torch.where(seen, rng[0], nmn), torch.where(seen, rng[1], nmx), nmn, nmx)
    bad = ~(torch.isfinite(lo) & torch.isfinite(hi))
    return moved + histogram_in_range(x, nmn, nmx, counts.numel()), torch.stack([nmn, nmx]), bad


def redistribute(counts: torch.Tensor, old_min: float, old_max: float,
                 new_min: float, new_max: float) -> torch.Tensor:
    """Move a histogram of [old_min, old_max] onto [new_min, new_max] ⊇ it (same bin count):
    each old bin [lo, hi) goes to the new bin holding lo, or is split between the two new bins
    it straddles with the lower share floor(frac·count), frac = the part of [lo, hi) below the
    boundary (float64 geometry). A constant histogram (old_min == old_max) moves whole."""
    if (old_min, old_max) == (new_min, new_max):
        return counts
    dev = counts.device
    t = [torch.tensor(v, dtype=torch.float64, device=dev) for v in (old_min, old_max, new_min, new_max)]
    return redistribute_in_range(counts, *t)


def redistribute_in_range(counts: torch.Tensor, old_min: torch.Tensor, old_max: torch.Tensor,
                          new_min: torch.Tensor, new_max: torch.Tensor) -> torch.Tensor:
    """``redistribute`` with 0-d float64 device tensors, no host read: the unchanged range,
    the constant histogram and the general split are all computed and the right one chosen
    with ``torch.where`` (indices are sanitised, so degenerate geometry cannot index out)."""
    nbins = counts.numel()
    dev = counts.device
    nw = (new_max - new_min) / nbins
    ow = (old_max - old_min) / nbins
    j = torch.arange(nbins, dtype=torch.float64, device=dev)
    lo = old_min + j * ow
    hi = lo + ow
    a = torch.nan_to_num(torch.floor((lo - new_min) / nw), nan=0.0).clamp_(0, nbins - 1)
    edge = new_min + (a + 1) * nw
    frac = torch.nan_to_num((edge - lo) / ow, nan=0.0).clamp_(0, 1)
    split = (hi > edge) & (a < nbins - 1)
    low = torch.where(split, torch.floor(frac * counts.double()).to(torch.int64), counts)
    ai = a.to(torch.int64)
    general = torch.zeros_like(counts).index_add_(0, ai, low)
    general.index_add_(0, (ai + 1).clamp_(max=nbins - 1), counts - low)
    # a constant histogram (all mass at old_min) moves whole to the new bin holding it
    at = torch.nan_to_num(torch.floor((old_min - new_min) / nw), nan=0.0).clamp_(0, nbins - 1).to(torch.int64)
    const = torch.zeros_like(counts).index_add_(0, at.reshape(1), counts.sum().reshape(1))
    same = (old_min == new_min) & (old_max == new_max)
    return torch.where(same, counts, torch.where(old_max == old_min, const, general))


def candidates(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate bin ranges (left, right) of the greedy walk (HFMG step 2), in walk
    order (one recorded after each trim). Compact tensors on counts' device;
    this public form reads the valid count back (the search itself does not: see
    ``hfmg_factors``)."""
    lefts, rights, valid, unfinished = _walk_table(counts)
    if bool(unfinished):
        return _host_walk(counts)
    return lefts[valid], rights[valid]


def _host_walk(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same walk on the host with bisection over the prefix sums: the fallback for an end
    game longer than ``_walk_table`` unrolls (not expected to happen; kept for safety)."""
    nbins = counts.numel()
    pre = [0] + torch.cumsum(counts.cpu(), 0).tolist()   # pre[t] = mass of bins [0, t)
    step = max(math.ceil(pre[-1] / 100000), 1)
    min_bins = math.ceil(nbins / 4)
    left, right = 0, nbins - 1
    lefts, rights = [], []
    while right - left > min_bins:
        tl = min(bisect.bisect_left(pre, pre[left] + step, left + 1, right + 1), right)
        tr = max(bisect.bisect_right(pre, pre[right + 1] - step, tl + 1, right + 1) - 2, tl)
        if right - tr >= tl - left:
            right = tr
        else:
            left = tl
        lefts.append(left)
        rights.append(right)
    dev = counts.device
    return (torch.tensor(lefts, dtype=torch.int64, device=dev),
            torch.tensor(rights, dtype=torch.int64, device=dev))


def _walk_table(counts: torch.Tensor):
    """The greedy walk (HFMG step 2) as fixed-size tensor ops (no host reads).

    Returns (lefts, rights, valid, unfinished): candidate ranges in walk order where
    ``valid`` marks the real ones (the rest is padding), and a 0-d flag that is true only if
    the bounded end game below did not finish (the caller then falls back to the host walk).

    How: TL[L] (left walk from L) and TR[R] (right walk from R) come from prefix sums by
    searchsorted. Ignoring the "not past each other" clamps, the left bounds visited form the
    chain 0 → TL[0] → …, the right bounds n−1 → TR[n−1] → …, and each step trims the side with
    the larger gap (right on ties); that greedy interleaving of two sequences equals a stable
    merge keyed by each sequence's running minimum of gaps, so the state before every step is
    known from searchsorted ranks. The chains are found by pointer doubling. The clamps only
    act when less than two steps' mass is left; from the first step where one would act (or
    the loop would stop) a few masked general steps finish the walk (each such step at least
    halves the open range, so ≤ 3 are needed before right − left ≤ nbins/4; 8 are run).
    """
    n = counts.numel()
    dev = counts.device
    min_bins = math.ceil(n / 4)
    pre = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(counts, 0, out=pre[1:])
    step = torch.clamp((pre[-1] + 99999) // 100000, min=1)
    tl = torch.searchsorted(pre, pre[:n] + step)                       # in [1, n+1]
    tr = torch.searchsorted(pre, pre[1:] - step, right=True) - 2       # in [-2, n-2]
    big = torch.full((2,), n + 1, dtype=torch.int64, device=dev)
    tl_p = torch.cat([tl, big])                                        # nodes 0 … n+1
    tr_p = torch.cat([torch.full((2,), -2, dtype=torch.int64, device=dev), tr])  # at R + 2
    chain_l = _chain(tl_p, 0, ascending=True, fill=n + 1)
    chain_r = _chain(tr_p + 2, n + 1, ascending=False, fill=0)             # node = R + 2
    gap_l = (chain_l[1:] - chain_l[:-1]).cummin(0).values
    gap_r = (chain_r[:-1] - chain_r[1:]).cummin(0).values
    m = gap_l.numel()
    pos_l = torch.arange(m, device=dev) + torch.searchsorted(-gap_r, -gap_l, right=True)
    is_left = torch.zeros(2 * m, dtype=torch.int64, device=dev)
    is_left[pos_l] = 1
    steps = n - min_bins + 1
    i_l = torch.zeros(steps + 1, dtype=torch.int64, device=dev)
    torch.cumsum(is_left[:steps], 0, out=i_l[1:])
    j_r = torch.arange(steps + 1, device=dev) - i_l
    left = chain_l[i_l]
    right = chain_r[j_r] - 2
    nxt_l = tl_p[left.clamp(0, n + 1)]
    clamp = (nxt_l > right) | (tr_p[right + 2] < nxt_l)
    free = (right - left > min_bins) & ~clamp
    n_free = free.to(torch.int64).cumprod(0).sum()                     # steps before the end game
    idx = torch.arange(1, steps + 1, device=dev)
    lefts, rights, valid = [left[1:]], [right[1:]], [idx <= n_free]
    lft, rgt = left[n_free], right[n_free]
    active = rgt - lft > min_bins
    for _ in range(8):
        a = torch.minimum(tl_p[lft.clamp(0, n + 1)], rgt)
        b = torch.maximum(tr_p[(rgt + 2).clamp(0, n + 1)], a)
        trim_right = (rgt - b) >= (a - lft)
        lft = torch.where(active & ~trim_right, a, lft)
        rgt = torch.where(active & trim_right, b, rgt)
        lefts.append(lft[None])
        rights.append(rgt[None])
        valid.append(active[None])
        active = active & (rgt - lft > min_bins)
    return torch.cat(lefts), torch.cat(rights), torch.cat(valid), active


def _chain(nxt: torch.Tensor, start: int, ascending: bool, fill: int) -> torch.Tensor:
    """Nodes reached from ``start`` by repeatedly following ``nxt`` (a monotone map), in
    visiting order, padded with ``fill`` to nxt's length — pointer doubling, log2(n) rounds."""
    size = nxt.numel()
    vis = torch.zeros(size, dtype=torch.int64, device=nxt.device)
    vis[start] = 1
    jump = nxt
    for _ in range(max(1, math.ceil(math.log2(size)) + 1)):
        vis = vis.index_add(0, jump, vis).clamp_(max=1)
        jump = jump[jump]
    rank = (vis.cumsum(0) if ascending else vis.flip(0).cumsum(0).flip(0)) - 1
    out = torch.full((size + 1,), fill, dtype=torch.int64, device=nxt.device)
    out.index_copy_(0, torch.where(vis > 0, rank, size), torch.arange(size, device=nxt.device))
    return out[:size]


def prefix_moments(counts: torch.Tensor) -> torch.Tensor:
    """int64 [3, n + 1] exact prefix sums of c_j, c_j·j and c_j·j² (the loss formula's input)."""
    n = counts.numel()
    j = torch.arange(n, dtype=torch.int64, device=counts.device)
    c = counts.to(torch.int64)
    pref = torch.zeros(3, n + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(torch.stack([c, c * j, c * j * j]), 1, out=pref[:, 1:])
    return pref


def losses(counts: torch.Tensor, width: float, lefts: torch.Tensor, rights: torch.Tensor,
           block: int = 1 << 20) -> torch.Tensor:
    """Analytic L2 loss (HFMG step 3) of every candidate, float64, O(256) per candidate.

    In units of one source bin (loss = width² · that), destination bin d of candidate (l, r)
    spans [y_d, y_{d+1}) with y_k = l + k·D, D = (r − l + 1)/256, except y_0 = 0 and
    y_256 = nbins (clamped indices: outside mass joins the end bins), centre c_d = l + (d+½)D.
    Its error is the whole source bins inside it — Σ c_j((j − c)² + (j − c) + ⅓), taken from
    exact int64 prefix sums of c_j, c_j·j, c_j·j² re-centred on the integer m = ⌊c⌋ so no
    large terms cancel — plus the partial source bins at its two edges, c_J((y − c)³ −
    (J − c)³)/3. Source bin J = ⌊y_k⌋ at an inner edge is then counted whole in bin k
    (centre c_k) and corrected at both sides; as c_k − c_{k−1} = D and c_{k−1} + c_k = 2y_k
    the two corrections sum to −D·c_J·ρ² with ρ = y_k − J (the outer edges give 0), so
    loss = Σ_d full_d − D·Σ_k c_J·ρ_k² — the same quantity in a third of the operations.
    Exact integer moments need Σcounts·nbins² < 2⁶³ (≈ 1.3e11 elements at 8192
    bins). Chunked over candidates (``block`` elements per work array). (The compiled CPU
    kernels evaluate the same formula per candidate, ~10× faster: amct_torch/kernels.)"""
    n = counts.numel()
    dev = counts.device
    out = torch.zeros(lefts.numel(), dtype=torch.float64, device=dev)
    if width <= 0 or lefts.numel() == 0:
        return out
    c = counts.to(torch.int64)
    pref = prefix_moments(c)
    cnt = torch.cat([c, c.new_zeros(1)]).double()
    k = torch.arange(DST_BINS + 1, dtype=torch.float64, device=dev)
    half = torch.arange(DST_BINS, dtype=torch.float64, device=dev) + 0.5
    chunk = max(1, block // (DST_BINS + 1))
    for st in range(0, lefts.numel(), chunk):
        l = lefts[st:st + chunk].to(torch.int64)[:, None]
        d = (rights[st:st + chunk].to(torch.int64)[:, None] - l + 1).double() / DST_BINS
        y = torch.addcmul(l.double(), k, d)             # [m, 257] edges in bin units (exact)
        y[:, 0] = 0.0
        y[:, -1] = float(n)
        jf = torch.floor(y)
        jj = jf.to(torch.int64).clamp_(0, n)
        ds = pref[:, jj].diff(dim=2)                    # [3, m, 256] moments of whole bins
        cen = torch.addcmul(l.double(), half, d)        # [m, 256] centres
        mf = torch.floor(cen)
        phi = cen - mf
        mi = mf.to(torch.int64)
        t0, ds1 = ds[0], ds[1]
        t1 = ds1 - mi * t0
        t2 = ds[2] - mi * (ds1 + t1)                    # Σc(j−m)² = S2 − 2mS1 + m²S0
        full = t2.double() + (1 - 2 * phi) * t1.double() + (phi * (phi - 1) + 1.0 / 3) * t0.double()
        # the source bins split by an edge: −D·c_J·ρ² with ρ = y − J (see the docstring)
        rho = y[:, 1:] - jf[:, 1:]
        split = (cnt[jj[:, 1:]] * (rho * rho)).sum(dim=1)
        loss = (full.sum(dim=1) - d[:, 0] * split) * (width * width)
        dw = width * d[:, 0]
        out[st:st + chunk] = torch.where(dw < FLT_EPS, torch.zeros_like(loss), loss)
    return out


@dataclass
class HfmgResult:
    """Factors plus the chosen bin range and every candidate's loss."""

    scale: float
    offset: int
    left: int
    right: int
    losses: torch.Tensor


def hfmg_factors(counts: torch.Tensor, mn: float, mx: float, asymmetric: bool = True,
                 search: Optional[Callable] = None) -> HfmgResult:
    """Search the histogram of [mn, mx] and return the factors (HFMG steps 2–4).
    ``search(counts, width) -> (lefts, rights, losses)``: an accelerator's walk and losses
    (the same candidates and formula; amct_torch/kernels); without it, or when it finds no
    candidate, the tensor walk and losses."""
    nbins = counts.numel()
    width = bin_width(mn, mx, nbins)
    if search is not None:
        lefts, rights, loss = search(counts, width)
        if lefts.numel():
            best = int(torch.argmin(loss))
            return factors_of_range(mn, width, int(lefts[best]), int(rights[best]), loss, asymmetric)
    lefts, rights, valid, unfinished = _walk_table(counts)
    loss = losses(counts, width, lefts, rights)
    masked = torch.where(valid, loss, torch.full_like(loss, math.inf))
    i = torch.argmin(masked)
    # the one host read of the search: chosen range, number of candidates, fallback flag
    left, right, unf = torch.stack([lefts[i], rights[i], unfinished.to(torch.int64)]).tolist()
    if unf:
        lefts, rights = _host_walk(counts)
        loss = losses(counts, width, lefts, rights)
        i = torch.argmin(loss)
        left, right = int(lefts[i]), int(rights[i])
    else:
        loss = loss[valid]
    return factors_of_range(mn, width, left, right, loss, asymmetric)


def factors_of_range(mn: float, width: float, left: int, right: int, loss: torch.Tensor,
                     asymmetric: bool) -> HfmgResult:
    """HFMG step 4: the chosen bin range [left, right] → scale and offset."""
    clip_min = to_float32(mn + left * width)
    clip_max = to_float32(mn + (right + 1) * width)
    if asymmetric:
        clip_max, clip_min = max(clip_max, 0.0), min(clip_min, 0.0)
        scale = to_float32((clip_max - clip_min) / 255)
        scale = 1.0 if scale < FLT_EPS else scale
        offset = -128 - int(torch.round(torch.tensor(clip_min / scale, dtype=torch.float32)))
    else:
        positive = clip_max > -clip_min
        scale = to_float32(clip_max / 127) if positive else to_float32(-clip_min / 128)
        scale = 1.0 if scale < FLT_EPS else scale
        offset = 0
    return HfmgResult(scale=scale, offset=offset, left=left, right=right, losses=loss)
