"""HFMG activation calibration (SPEC §5.3) as tensor functions.

Histogram build and the sequential merge rule, the greedy candidate ranges, the analytic L2
loss of every candidate (one batched tensor evaluation), and the factors.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Tuple

import torch

from amct_torch.algorithms.quant import FLT_EPS

DST_BINS = 256


def bin_width(mn: float, mx: float, nbins: int) -> float:
    """Width of one bin of [mn, mx] as float32 (the value the data is binned with)."""
    return float(torch.tensor((mx - mn) / nbins, dtype=torch.float32))


def histogram(x: torch.Tensor, mn: float, mx: float, nbins: int) -> torch.Tensor:
    """int64 counts of flat float32 ``x`` over [mn, mx]: bin = min(floor((x − mn)/w), nbins−1)
    with w = float32((mx − mn)/nbins), all computed in float32; mn == mx → the middle bin."""
    if mx == mn:
        out = torch.zeros(nbins, dtype=torch.int64, device=x.device)
        out[nbins // 2] = x.numel()
        return out
    w = bin_width(mn, mx, nbins)
    t = torch.sub(x, torch.tensor(mn, dtype=torch.float32, device=x.device))
    t.div_(torch.tensor(w, dtype=torch.float32, device=x.device))
    cnt = torch.bincount(t.to(torch.int32), minlength=nbins)
    if cnt.numel() > nbins:
        cnt[nbins - 1] += cnt[nbins:].sum()
        cnt = cnt[:nbins]
    return cnt


def redistribute(counts: torch.Tensor, old_min: float, old_max: float,
                 new_min: float, new_max: float) -> torch.Tensor:
    """Move a histogram of [old_min, old_max] onto [new_min, new_max] ⊇ it (same bin count):
    each old bin [lo, hi) goes to the new bin holding lo, or is split between the two new bins
    it straddles with the lower share floor(frac·count), frac = the part of [lo, hi) below the
    boundary (float64 geometry). A constant histogram (old_min == old_max) moves whole."""
    nbins = counts.numel()
    if (old_min, old_max) == (new_min, new_max):
        return counts
    out = torch.zeros_like(counts)
    nw = (new_max - new_min) / nbins
    if old_max == old_min:
        a = min(nbins - 1, max(0, math.floor((old_min - new_min) / nw)))
        out[a] = counts.sum()
        return out
    ow = (old_max - old_min) / nbins
    j = torch.arange(nbins, dtype=torch.float64, device=counts.device)
    lo = old_min + j * ow
    hi = lo + ow
    a = torch.floor((lo - new_min) / nw).clamp_(0, nbins - 1)
    edge = new_min + (a + 1) * nw
    frac = ((edge - lo) / ow).clamp_(0, 1)
    split = (hi > edge) & (a < nbins - 1)
    low = torch.where(split, torch.floor(frac * counts.double()).to(torch.int64), counts)
    ai = a.to(torch.int64)
    out.index_add_(0, ai, low)
    out.index_add_(0, (ai + 1).clamp_(max=nbins - 1), counts - low)
    return out


def candidates(counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Candidate bin ranges (left, right) of the greedy walk of SPEC §5.3 step 2, preceded by
    the full range (0, nbins−1).

    The walk runs on the host over the prefix sums (one transfer of the histogram, then
    O(log nbins) per trim with bisection — no per-bin reads of device memory)."""
    nbins = counts.numel()
    pre = [0] + torch.cumsum(counts.cpu(), 0).tolist()   # pre[t] = mass of bins [0, t)
    total = pre[-1]
    step = max(math.ceil(total / 100000), 1)
    min_bins = math.ceil(nbins / 4)
    left, right = 0, nbins - 1
    lefts, rights = [left], [right]
    while right - left > min_bins:
        # left walk: smallest tl in (left, right] with mass[left, tl) ≥ step, else right
        tl = bisect.bisect_left(pre, pre[left] + step, left + 1, right + 1)
        tl = min(tl, right)
        # right walk: largest tr in [tl, right) with mass(tr, right] ≥ step, else tl
        need = pre[right + 1] - step
        tr = bisect.bisect_right(pre, need, tl + 1, right + 1) - 2
        tr = max(tr, tl)
        if right - tr >= tl - left:
            right = tr
        else:
            left = tl
        lefts.append(left)
        rights.append(right)
    dev = counts.device
    return torch.tensor(lefts, device=dev), torch.tensor(rights, device=dev)


def losses(counts: torch.Tensor, width: float, lefts: torch.Tensor, rights: torch.Tensor,
           block: int = 1 << 21) -> torch.Tensor:
    """Analytic L2 loss (SPEC §5.3 step 3) of every candidate, float64, chunked over
    candidates: source bins mapped to 256 destination bins, uniform density inside each."""
    nbins = counts.numel()
    dev = counts.device
    density = (counts.double() / width)[None, :] if width > 0 else None
    src = torch.arange(nbins, dtype=torch.float64, device=dev)[None, :]
    out = torch.zeros(lefts.numel(), dtype=torch.float64, device=dev)
    if width <= 0:
        return out
    chunk = max(1, block // nbins)
    for st in range(0, lefts.numel(), chunk):
        l = lefts[st:st + chunk].double()[:, None]
        r = rights[st:st + chunk].double()[:, None]
        dw = width * (r - l + 1) / DST_BINS
        b = (src - l) * width
        e = b + width
        db_i = torch.floor(b / dw).clamp_(0, DST_BINS - 1)
        de_i = torch.floor(e / dw).clamp_(0, DST_BINS - 1)
        half = dw / 2
        c_b = (db_i + 0.5) * dw
        c_e = (de_i + 0.5) * dw
        norm = ((half ** 3 - (b - c_b) ** 3)
                + (de_i - db_i - 1) * (2 * half ** 3)
                + ((e - c_e) ** 3 + half ** 3)) / 3
        loss = (density * norm).sum(dim=1)
        out[st:st + chunk] = torch.where(dw[:, 0] < FLT_EPS, torch.zeros_like(loss), loss)
    return out


@dataclass
class HfmgResult:
    """Factors plus the chosen bin range and every candidate's loss."""

    scale: float
    offset: int
    left: int
    right: int
    losses: torch.Tensor


def hfmg_factors(counts: torch.Tensor, mn: float, mx: float, asymmetric: bool = True) -> HfmgResult:
    """Search the histogram of [mn, mx] and return the factors (SPEC §5.3 steps 2–4)."""
    nbins = counts.numel()
    width = bin_width(mn, mx, nbins)
    lefts, rights = candidates(counts)
    loss = losses(counts, width, lefts, rights)
    i = int(torch.argmin(loss))
    left, right = int(lefts[i]), int(rights[i])
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731  float32 arithmetic
    clip_min = f32(mn + left * width)
    clip_max = f32(mn + (right + 1) * width)
    if asymmetric:
        clip_max, clip_min = max(clip_max, 0.0), min(clip_min, 0.0)
        scale = f32((clip_max - clip_min) / 255)
        scale = 1.0 if scale < FLT_EPS else scale
        offset = -128 - int(torch.round(torch.tensor(clip_min / scale, dtype=torch.float32)))
    else:
        positive = clip_max > -clip_min
        scale = f32(clip_max / 127) if positive else f32(-clip_min / 128)
        scale = 1.0 if scale < FLT_EPS else scale
        offset = 0
    return HfmgResult(scale=scale, offset=offset, left=left, right=right, losses=loss)
