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

from amct_torch.algorithms import native

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


#: low bits of a packed accumulator entry that hold the offset sum (the rest: the count)
OFFSET_BITS = 40
#: most elements one packed accumulator may take (no field can overflow and the sign bit
#: stays clear: counts < 2^23 in bits 40–62, offset sums ≤ 2^16 · 2^23 < 2^40)
MAX_SLICE = (1 << (63 - OFFSET_BITS)) - 1
#: offsets are summed in units of 2^-16 of a bin (exact integer sums, order-independent)
OFFSET_UNIT = 2.0 ** -16


def packed_slice(x: torch.Tensor, s: float, base: float, slots: int) -> torch.Tensor:
    """The torch formula of one packed accumulator (``hist_kernels.c`` computes the same
    integers): u = x·s − base in float32, bin j = trunc(u), offset q = trunc((u − j)·65536 + ½)
    in float32, and entry j sums q + 2^OFFSET_BITS over its elements. ``x`` flat float32
    inside the frame, at most ``MAX_SLICE`` elements; returns int64 [slots]."""
    u = torch.mul(x, s)
    if base:
        u.sub_(base)
    idx = u.to(torch.int32)
    u.frac_().mul_(65536.0).add_(0.5)   # u − trunc(u) = offset inside the bin (u ≥ 0)
    packed = u.to(torch.int32).to(torch.int64).add_(1 << OFFSET_BITS)
    return torch.zeros(slots, dtype=torch.int64, device=x.device).index_add_(0, idx, packed)


def accumulate(x: torch.Tensor, e: int, base: int, counts: torch.Tensor, dsum: torch.Tensor,
               threads: int = 1) -> None:
    """Add flat float32 ``x`` (all inside the frame) into ``counts`` (int64) and ``dsum``
    (float64 offsets in bin units), both of nbins + 1 entries: the extra slot takes elements
    whose x/w − base rounded up to nbins (``fold_overflow`` moves them to the last bin).

    Counts and offsets (in 2^-16 bin units) are packed into one int64 per bin, so each
    element costs one scatter; slices of ≤ ``MAX_SLICE`` elements are decoded separately.
    On the CPU the compiled kernel does it on ``threads`` threads (native.py), elsewhere the
    torch formula; both give the same integers, so the state does not depend on either."""
    s, b, slots = math.ldexp(1.0, -e), float(base), counts.numel()
    if native.usable(x):                 # the fused kernel with no candidates: a plain histogram
        r = native.stream_update(x, s, b, slots, OFFSET_BITS, math.inf, -math.inf, 0, MAX_SLICE, threads)
        if r.outside:
            raise ValueError(f"{r.outside} values lie outside the histogram's frame")
        native.add_packed(r.acc, counts, dsum, OFFSET_BITS)
        return
    acc = torch.stack([packed_slice(x[st:st + MAX_SLICE], s, b, slots) for st in range(0, x.numel(), MAX_SLICE)])
    add_packed(acc, counts, dsum)


def add_packed(acc: torch.Tensor, counts: torch.Tensor, dsum: torch.Tensor) -> None:
    """Decode packed accumulators (int64 [slices, slots], one row per slice) and add them to
    ``counts``/``dsum``: the integer fields are summed first, so the result does not depend
    on the slicing. (``native.add_packed`` does the same in one kernel call.)"""
    fields = [acc >> OFFSET_BITS, acc & ((1 << OFFSET_BITS) - 1)]
    if acc.shape[0] > 1:
        fields = [f.sum(0) for f in fields]
    else:
        fields = [f[0] for f in fields]
    counts.add_(fields[0])
    dsum.add_(fields[1].double().mul_(OFFSET_UNIT))


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
