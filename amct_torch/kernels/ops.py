"""The CPU backend on the compiled kernels: the observers' operations
(``calibration/backends.py`` lists them) with the same results as the torch formulas.

Why it may read scalars: on the CPU a tensor's value is plain memory, so the kernels decide
on the host what the tensor path decides with fixed-shape ops — whether a batch stays inside
the histogram's frame (then one fused C call bins it, merges its extreme values into the
top/bottom buffers and commits), or needs the general path. Batches the kernels do not take
(the first of a state whose candidates overflow the pass's room, NaN/Inf data) go to the
torch formulas on the same state, which give the same integers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from amct_torch.algorithms import hfmg, histogram
from amct_torch.algorithms.ifmr import level_ranges
from amct_torch.algorithms.quant import FLT_EPS
from amct_torch.algorithms.streaming import StreamState
from amct_torch.kernels import native

#: group size of the first-batch bound (native.chunk_bounds): fewer than topk groups pass
#: the bound, i.e. at most topk·FINE_CHUNK candidates a slice
FINE_CHUNK = 32
#: a fused update with up to this many candidates per side merges them in C
INSERT_MAX = 1 << 15


def _cpu_f32(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()


class KernelBackend:
    """Faster CPU versions of the observers' operations (same state, same results)."""

    name = "cpu-kernels"

    def __init__(self, fallback) -> None:
        self.fallback = fallback

    # -- streaming IFMR ---------------------------------------------------------------
    def stream_update(self, st: StreamState, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Returns None when the batch was clean (known here without a device), else the
        torch path's NaN/Inf flag."""
        if not (_cpu_f32(x) and st.top.device.type == "cpu"):
            return self.fallback.stream_update(st, x)
        threads = torch.get_num_threads()
        count = int(_views(st).count)          # CPU state: plain memory, read through numpy views
        if count and not np.isfinite(_views(st).range).all():   # after NaN/Inf (flagged)
            return self.fallback.stream_update(st, x)
        if count and self._fused(st, x, threads):
            return None
        k = st.top.numel()
        b = native.chunk_bounds(x, FINE_CHUNK, k, threads)
        if b.nans or not (math.isfinite(b.lo) and math.isfinite(b.hi)):
            return self.fallback.stream_update(st, x)        # flags the batch, indices stay in bounds
        before = st.clone()
        _widen(st, b.lo, b.hi)
        _fold_bounds(st, b.kth_hi, b.kth_lo)
        if self._fused(st, x, threads):
            return None
        _restore(st, before)                                  # the general path starts from scratch
        return self.fallback.stream_update(st, x)

    def _fused(self, st: StreamState, x: torch.Tensor, threads: int) -> bool:
        """One compiled call that bins the batch, merges its candidates and commits — when
        the batch keeps the frame and its candidates fit; False leaves ``st`` untouched."""
        v = _views(st)
        e, base = v.frame.tolist()
        rng = v.range
        gmin, gmax = rng.tolist()
        nbins, k = st.nbins, st.top.numel()
        commit = native.Commit(gmin, gmax, e, nbins, histogram.REL_BITS, histogram.MIN_EXP,
                               st.top, st.bottom, st.counts, st.dsum, INSERT_MAX)
        r = native.stream_update(x, math.ldexp(1.0, -e), float(base), nbins + 1, histogram.OFFSET_BITS,
                                 float(v.top[-1]), float(v.bottom[-1]), k * FINE_CHUNK,
                                 histogram.MAX_SLICE, threads, commit)
        if not r.committed:
            return False
        rng[:] = r.committed[2:]
        np.add(v.count, x.numel(), out=v.count)
        return True

    # -- HFMG -------------------------------------------------------------------------
    def hfmg_update(self, counts: torch.Tensor, rng: torch.Tensor, seen: torch.Tensor, x: torch.Tensor):
        nbins = counts.numel()
        if not (_cpu_f32(x) and counts.dtype == torch.int64 and counts.is_contiguous()
                and counts.device.type == "cpu" and rng.numel() == 2):
            return self.fallback.hfmg_update(counts, rng, seen, x)
        threads = torch.get_num_threads()
        was_seen = bool(seen)
        mn, mx = rng.tolist() if was_seen else (math.inf, -math.inf)
        if was_seen and not (math.isfinite(mn) and math.isfinite(mx)):    # after NaN/Inf (flagged)
            return self.fallback.hfmg_update(counts, rng, seen, x)
        inside = was_seen and mx > mn
        if inside:
            r = native.hfmg_pass(x, mn, mx, hfmg.bin_width(mn, mx, nbins), nbins, threads, into=counts)
        else:                                  # no range yet, or a constant one: the extremes
            r = native.hfmg_pass(x, math.inf, -math.inf, 0.0, nbins, threads)
        if not r.outside:
            return counts, rng, None
        lo, hi = min(r.lo, mn), max(r.hi, mx)
        if r.nans or not (math.isfinite(lo) and math.isfinite(hi)):
            return self.fallback.hfmg_update(counts, rng, seen, x)
        if not was_seen:
            new = _hfmg_hist(x, lo, hi, nbins, threads)
        else:
            new = native.hfmg_redistribute(counts, mn, mx, lo, hi) if mx > mn \
                else hfmg.redistribute(counts, mn, mx, lo, hi)
            if hi > lo:
                native.hfmg_pass(x, lo, hi, hfmg.bin_width(lo, hi, nbins), nbins, threads, into=new)
            else:
                new = new + hfmg.histogram(x, lo, hi, nbins)
        return new, torch.tensor([lo, hi], dtype=torch.float64), None

    def hfmg_search(self, counts: torch.Tensor, width: float):
        """The literal walk and the per-candidate losses in C (microseconds)."""
        lefts, rights = native.hfmg_walk(counts)
        if not lefts.numel() or width <= 0:
            return lefts, rights, torch.zeros(lefts.numel(), dtype=torch.float64)
        c = counts.to(torch.int64).cpu()
        loss = native.hfmg_losses(hfmg.prefix_moments(c), torch.cat([c, c.new_zeros(1)]), lefts, rights,
                                  width, FLT_EPS, torch.get_num_threads())
        return lefts, rights, loss

    # -- IFMR search ------------------------------------------------------------------
    def ifmr_hist_losses(self, bin_lo, width, counts, dsum, lo, hi, s) -> torch.Tensor:
        """``ifmr.histogram_losses`` per candidate in C (same formula and signature)."""
        s64, m_lo, k = level_ranges(lo, hi, s)
        return native.ifmr_hist_losses(counts, dsum, float(bin_lo[0]), width, m_lo, k, s64)


@dataclass(frozen=True)
class _Views:
    """numpy views of a CPU state's small tensors (the same memory)."""

    tensors: tuple
    count: np.ndarray
    frame: np.ndarray
    range: np.ndarray
    top: np.ndarray
    bottom: np.ndarray


def _views(st: StreamState) -> _Views:
    """The state's numpy views, made once per set of tensors: the updates write the tensors
    in place, so the views stay valid until a tensor is replaced (merge, load)."""
    tensors = (st.count, st.frame, st.range, st.top, st.bottom)
    v = st.backend_cache
    if v is None or any(a is not b for a, b in zip(v.tensors, tensors)):
        v = _Views(tensors, *(t.numpy() for t in tensors))
        st.backend_cache = v
    return v


def _restore(st: StreamState, before: StreamState) -> None:
    for name in ("count", "top", "bottom", "counts", "dsum", "frame", "range"):
        getattr(st, name).copy_(getattr(before, name))


def _hfmg_hist(x: torch.Tensor, lo: float, hi: float, nbins: int, threads: int) -> torch.Tensor:
    if hi == lo:
        return hfmg.histogram(x, lo, hi, nbins)
    found = native.hfmg_pass(x, lo, hi, hfmg.bin_width(lo, hi, nbins), nbins, threads)
    assert found.counts is not None  # [lo, hi] holds all of x (its NaNs were ruled out)
    return found.counts


def _widen(st: StreamState, lo: float, hi: float) -> None:
    """Grow the range to hold [lo, hi] and move the histogram to the frame it needs (the
    frame rule of ``histogram.frame_for`` with the current exponent as a floor)."""
    gmin, gmax = st.range.tolist()
    if not (lo < gmin or hi > gmax):
        return
    gmin, gmax = min(lo, gmin), max(hi, gmax)
    count = int(st.count)
    e_old, base_old = (int(v) for v in st.frame.tolist())
    e, base = histogram.frame_for(gmin, gmax, st.nbins, e_old if count else histogram.MIN_EXP)
    if count and (e, base) != (e_old, base_old):
        histogram.fold_overflow(st.counts, st.dsum)
        n = st.nbins
        c, d = histogram.reframe(st.counts[:n], st.dsum[:n], e_old, base_old, e, base)
        st.counts[:n].copy_(c)
        st.dsum[:n].copy_(d)
    st.frame.copy_(torch.tensor([e, base], dtype=torch.int64))
    st.range.copy_(torch.tensor([gmin, gmax], dtype=torch.float64))


def _fold_bounds(st: StreamState, m_hi: float, m_lo: float) -> None:
    """Fold a first batch's bounds into the buffers before its pass: ``m_hi`` is the K-th
    largest maximum of its groups of values, so K of its values are ≥ m_hi and the top K of
    the state and the batch is the top K of the state, K copies of m_hi and the batch's
    values > m_hi; with the copies in, the pass collects only values > m_hi (fewer than K
    groups hold one: at most K·FINE_CHUNK values, which it has room for). Likewise the
    bottom. The copies stand for batch values, so the buffers stay exact."""
    count = int(st.count)
    k = st.top.numel()
    for buf, m, largest in ((st.top, m_hi, True), (st.bottom, m_lo, False)):
        thr = float(buf[-1])
        if not (m > thr if largest else m < thr):
            continue
        if count == 0:
            buf.fill_(m)                      # the buffer held only its ∓inf padding
        else:
            native.insert_extremes(buf, torch.full((k,), m), largest)
