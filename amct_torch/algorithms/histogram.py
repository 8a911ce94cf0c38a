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

import torch

#: finest bin relative to the data's magnitude (keeps |x/w| < 2**22: exact in float32)
REL_BITS = 21
MIN_EXP = -100


def frame_for(gmin: float, gmax: float, nbins: int, e_floor: int = MIN_EXP) -> tuple[int, int]:
    """Smallest e ≥ max(the magnitude floor, ``e_floor``) whose grid holds [gmin, gmax] in
    nbins bins, and base = floor(gmin / 2^e): ``frame_of`` (the one definition) for host
    values."""
    e, base = frame_of(torch.tensor(gmin, dtype=torch.float64), torch.tensor(gmax, dtype=torch.float64), nbins,
                       torch.tensor(e_floor, dtype=torch.int64))
    return int(e), int(base)


#: low bits of a packed accumulator entry that hold the offset sum (the rest: the count)
OFFSET_BITS = 40
#: most elements one packed accumulator may take (no field can overflow and the sign bit
#: stays clear: counts < 2^23 in bits 40–62, offset sums ≤ 2^16 · 2^23 < 2^40)
MAX_SLICE = (1 << (63 - OFFSET_BITS)) - 1
#: offsets are summed in units of 2^-16 of a bin (exact integer sums, order-independent)
OFFSET_UNIT = 2.0 ** -16


def packed_slice(x: torch.Tensor, s, base, slots: int) -> torch.Tensor:
    """The torch formula of one packed accumulator (``amct_torch/kernels`` computes the same
    integers): u = x·s − base in float32, bin j = trunc(u), offset q = trunc((u − j)·65536 + ½)
    in float32, and entry j sums q + 2^OFFSET_BITS over its elements. ``x`` flat float32
    inside the frame, at most ``MAX_SLICE`` elements; ``s``/``base`` Python floats or 0-d
    float32 tensors (the same float32 arithmetic); returns int64 [slots]. Bins are clamped
    to [0, slots) so that data outside the frame (NaN/Inf, flagged by the caller) can never
    write out of bounds."""
    u = torch.mul(x, s)
    u.sub_(base)
    idx = u.to(torch.int32).clamp_(0, slots - 1)
    u.frac_().mul_(65536.0).add_(0.5)   # u − trunc(u) = offset inside the bin (u ≥ 0)
    packed = u.to(torch.int32).to(torch.int64).add_(1 << OFFSET_BITS)
    return torch.zeros(slots, dtype=torch.int64, device=x.device).index_add_(0, idx, packed)


def accumulate(x: torch.Tensor, e: int, base: int, counts: torch.Tensor, dsum: torch.Tensor) -> None:
    """Add flat float32 ``x`` (all inside the frame) into ``counts`` (int64) and ``dsum``
    (float64 offsets in bin units), both of nbins + 1 entries: the extra slot takes elements
    whose x/w − base rounded up to nbins (``fold_overflow`` moves them to the last bin).
    Host-side frame (Python ints): the form the tests and the compiled kernels' checks use;
    the observers' sync-free path is ``accumulate_in_frame``."""
    s = torch.tensor(math.ldexp(1.0, -e), dtype=torch.float32, device=x.device)
    accumulate_in_frame(x, s, torch.tensor(float(base), dtype=torch.float32, device=x.device), counts, dsum)


def accumulate_in_frame(x: torch.Tensor, s: torch.Tensor, base: torch.Tensor, counts: torch.Tensor,
                        dsum: torch.Tensor) -> None:
    """``accumulate`` with the frame as 0-d float32 device tensors (s = 2^−e, base): no host
    read. Counts and offsets (in 2^-16 bin units) are packed into one int64 per bin, so each
    element costs one scatter; slices of ≤ ``MAX_SLICE`` elements are decoded separately."""
    slots = counts.numel()
    acc = torch.stack([packed_slice(x[st:st + MAX_SLICE], s, base, slots)
                       for st in range(0, x.numel(), MAX_SLICE)])
    add_packed(acc, counts, dsum)


def add_packed(acc: torch.Tensor, counts: torch.Tensor, dsum: torch.Tensor) -> None:
    """Decode packed accumulators (int64 [slices, slots], one row per slice) and add them to
    ``counts``/``dsum``: the integer fields are summed first, so the result does not depend
    on the slicing. (``native.add_packed`` does the same in one kernel call.)"""
    fields = [acc >> OFFSET_BITS, acc & ((1 << OFFSET_BITS) - 1)]
    fields = [f.sum(0) for f in fields] if acc.shape[0] > 1 else [f[0] for f in fields]
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


def reframe(counts: torch.Tensor, dsum: torch.Tensor, e_old, base_old, e_new,
            base_new) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a histogram of nbins bins to a coarser (or shifted) frame; counts move exactly.
    Frames as Python ints or 0-d int64 device tensors (then no host read: an unchanged frame
    goes through the same ops and comes out bit for bit the same)."""
    nbins = counts.numel()
    if all(isinstance(v, int) for v in (e_old, base_old, e_new, base_new)) \
            and (e_old, base_old) == (e_new, base_new):
        return counts, dsum
    dev = counts.device
    d = torch.as_tensor(e_new, device=dev) - torch.as_tensor(e_old, device=dev)
    p = torch.bitwise_left_shift(torch.ones((), dtype=torch.int64, device=dev), d.clamp(0, 62))
    g = torch.arange(nbins, dtype=torch.int64, device=dev) + base_old
    big = torch.div(g, p, rounding_mode="floor")
    rem = (g - big * p).double()
    j = (big - base_new).clamp_(0, nbins - 1)  # only empty bins can fall outside
    new_c = torch.zeros_like(counts).index_add_(0, j, counts)
    new_d = torch.zeros_like(dsum).index_add_(0, j, (dsum + counts.double() * rem) / p.double())
    return new_c, new_d


def frame_of(gmin: torch.Tensor, gmax: torch.Tensor, nbins: int,
             e_floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``frame_for`` in tensor ops (0-d float64 range, 0-d int64 floor; no host read): the
    smallest e ≥ ``e_floor`` whose grid holds [gmin, gmax] in nbins bins, and its base.
    frame_for's loop adds at most two steps to its first guess (with 2^e ≤ span/nbins the
    two floors differ by < 2·nbins at e + 1 and ≤ nbins at e + 2), so four candidates are
    tried side by side. A non-finite range (NaN/Inf data, flagged by the caller) gives some
    bounded frame."""
    dev = gmin.device
    maxabs = torch.maximum(gmin.abs(), gmax.abs())
    e = torch.frexp(maxabs).exponent.to(torch.int64) - 1 - REL_BITS
    e = torch.where(maxabs == 0, torch.full_like(e, MIN_EXP), e).clamp_(min=MIN_EXP)
    span = gmax - gmin
    e_span = torch.frexp(span / nbins).exponent.to(torch.int64) - 1
    e = torch.where(span > 0, torch.maximum(e, e_span), e)
    e = torch.maximum(e, e_floor).clamp_(MIN_EXP, 1100)
    ks = e + torch.arange(4, dtype=torch.int64, device=dev)
    lo = torch.floor(torch.ldexp(gmin.expand(4).contiguous(), -ks))
    hi = torch.floor(torch.ldexp(gmax.expand(4).contiguous(), -ks))
    fits = (hi - lo) <= nbins - 1
    k = torch.where(fits.any(), torch.argmax(fits.to(torch.uint8)), torch.full_like(e, 3)).reshape(1)
    base = torch.nan_to_num(lo.index_select(0, k), nan=0.0, posinf=0.0, neginf=0.0).clamp_(-2.0 ** 60, 2.0 ** 60)
    return ks.index_select(0, k)[0], base.to(torch.int64)[0]


def bin_starts(e: int, base: int, nbins: int, device) -> torch.Tensor:
    """Absolute start of every bin, float64."""
    return (torch.arange(nbins, dtype=torch.float64, device=device) + base) * math.ldexp(1.0, e)
