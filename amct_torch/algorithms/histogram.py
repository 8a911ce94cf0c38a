"""A mergeable fine histogram on a power-of-two grid (state of streaming IFMR).

Bin edges are multiples of w = 2**e (anchored at 0); the histogram covers absolute bin
indices [base, base + nbins). Growing the range doubles w, which merges bin pairs exactly,
so the frame (e, base) is a pure function of the global (min, max) and merging two states is
exact for counts whatever order the data came in. Each bin also keeps the sum of the
elements' offsets from the bin start, in bin units (``dsum``), which makes the IFMR loss
exact for every bin that does not straddle a rounding boundary.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch

#: finest bin relative to the data's magnitude (keeps |x/w| < 2**22: exact in float32)
REL_BITS = 21
MIN_EXP = -100


def frame_for(gmin: float, gmax: float, nbins: int) -> Tuple[int, int]:
    """Smallest e (≥ the magnitude floor) whose grid holds [gmin, gmax] in nbins bins; base."""
    maxabs = max(abs(gmin), abs(gmax))
    e = MIN_EXP if maxabs == 0 else max(MIN_EXP, math.frexp(maxabs)[1] - 1 - REL_BITS)
    span = gmax - gmin
    if span > 0:
        e = max(e, math.frexp(span / nbins)[1] - 1)
    while math.floor(math.ldexp(gmax, -e)) - math.floor(math.ldexp(gmin, -e)) > nbins - 1:
        e += 1
    return e, math.floor(math.ldexp(gmin, -e))


def bin_of(x: torch.Tensor, e: int, base: int, nbins: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Counts (int64) and offset sums (float64, bin units) of flat float32 ``x`` (all inside
    the frame) per bin."""
    counts = torch.zeros(nbins + 1, dtype=torch.int64, device=x.device)
    dsum = torch.zeros(nbins + 1, dtype=torch.float64, device=x.device)
    accumulate(x, e, base, counts, dsum)
    fold_overflow(counts, dsum)
    return counts[:nbins], dsum[:nbins]


def accumulate(x: torch.Tensor, e: int, base: int, counts: torch.Tensor, dsum: torch.Tensor) -> None:
    """Add flat float32 ``x`` (all inside the frame) into ``counts`` (int64) and ``dsum``
    (offsets in bin units; float32 or float64), both of nbins + 1 entries: the extra slot takes
    elements whose x/w − base rounded up to nbins (``fold_overflow`` moves them to the last bin).

    Four passes over x plus two scatters: u = x/w − base (exact scaling, one rounding),
    idx = trunc(u) (u ≥ 0, so the floor), u.frac_() (the offset), then counts and offset
    sums by ``index_add_``. A float64 ``dsum`` goes through a float32 temporary (index_add_
    needs one dtype): offsets are then summed in float32 within the call, as ``bincount``
    would."""
    u = torch.mul(x, math.ldexp(1.0, -e))
    if base:
        u.sub_(float(base))
    idx = u.to(torch.int32)
    u.frac_()                        # u − trunc(u) = offset inside the bin, in bin units
    counts.index_add_(0, idx, _one(x.device).expand(idx.numel()))
    if dsum.dtype == torch.float32:
        dsum.index_add_(0, idx, u)
    else:
        dsum.add_(torch.zeros(dsum.numel(), dtype=torch.float32, device=x.device).index_add_(0, idx, u))


def fold_overflow(counts: torch.Tensor, dsum: torch.Tensor) -> None:
    """Move the overflow slot (last entry) of an nbins + 1 state into the last bin, in place:
    those elements sit at the bin's top edge (offset 1)."""
    n = counts.numel() - 1
    counts[n - 1] += counts[n]
    dsum[n - 1] += dsum[n] + counts[n].double()
    counts[n] = 0
    dsum[n] = 0.0


_ONES: dict = {}


def _one(device) -> torch.Tensor:
    """A cached int64 scalar 1 per device (broadcast as the scatter source of counts)."""
    key = str(device)
    t = _ONES.get(key)
    if t is None:
        t = _ONES[key] = torch.ones((), dtype=torch.int64, device=device)
    return t


def count_bins(idx: torch.Tensor, size: int) -> torch.Tensor:
    """int64 counts of non-negative int ``idx`` (all < ``size``): one scatter-add of a
    broadcast 1 (``bincount`` also scans for the min and max first — two extra passes)."""
    out = torch.zeros(size, dtype=torch.int64, device=idx.device)
    return out.index_add_(0, idx, _one(idx.device).expand(idx.numel()))


def reframe(counts: torch.Tensor, dsum: torch.Tensor, e_old: int, base_old: int,
            e_new: int, base_new: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Move a histogram to a coarser (or shifted) frame; counts move exactly."""
    nbins = counts.numel()
    if (e_old, base_old) == (e_new, base_new):
        return counts, dsum
    d = e_new - e_old
    g = torch.arange(nbins, dtype=torch.int64, device=counts.device) + base_old
    big = g // (1 << d)
    rem = (g - big * (1 << d)).double()
    j = (big - base_new).clamp_(0, nbins - 1)  # only empty bins can fall outside
    new_c = torch.zeros_like(counts).index_add_(0, j, counts)
    new_d = torch.zeros_like(dsum).index_add_(0, j, (dsum + counts.double() * rem) / (1 << d))
    return new_c, new_d


def bin_starts(e: int, base: int, nbins: int, device) -> torch.Tensor:
    """Absolute start of every bin, float64."""
    return (torch.arange(nbins, dtype=torch.float64, device=device) + base) * math.ldexp(1.0, e)
