"""Observers: one small mergeable state per quantized input (ARCHITECTURE: statistics are
mergeable values).

Each observer has ``update(x)``, ``merge(other)``, ``compute() -> (scale, offset)``,
``state_dict()`` (tensors only) / ``load_state_dict(d)`` and ``reset()``. The state lives on
the data's device; float16/bfloat16 data is computed in float32; NaN/Inf raises
``CalibrationError`` naming the layer. The maths is in ``amct_torch.algorithms``.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from amct_torch.algorithms import hfmg, histogram, native
from amct_torch.algorithms.ifmr import ifmr_exact, ifmr_from_histogram
from amct_torch.errors import CalibrationError

#: exact top-k/bottom-k buffer size of streaming IFMR (covers k ≤ 1024, i.e. L ≤ ~1e9 at p = 0.999999)
TOPK = 1024
#: bins of the streaming IFMR histogram
STREAM_BINS = 16384
_CHUNK = 256
#: group size of the first-batch bound on the compiled path (native.chunk_bounds): the bound
#: of ``_fold_bounds`` lets fewer than topk groups through, i.e. at most topk·32 candidates
_FINE_CHUNK = 32
#: group size of the second pruning step of the top-k candidates
_GROUP = 16
#: a compiled update with up to this many candidates per side merges them into the top/bottom
#: buffers in C (cut to the K best, sorted, merged); more leave it to the general path
_INSERT_MAX = 1 << 15


#: intra-op threads for the observers' CPU torch work (None: leave torch's setting). The
#: torch part of an update is a few memory-bound passes of ~0.1–0.3 ns per element; with two
#: or more OpenMP threads each pass also pays a fork/join, which on a busy machine (other
#: processes on every core) waits for a descheduled worker — measured ~7.5 ms per pass on
#: this project's 2-core machine, 20–70× the pass itself. The compiled kernels (native.py)
#: run one parallel region per update with torch's thread count as it was outside this
#: setting (the slices' work dwarfs one fork/join). docs/algorithms.md has the measurements.
CPU_THREADS: Optional[int] = 1


@contextlib.contextmanager
def cpu_threads(device: torch.device) -> Iterator[None]:
    """Run the enclosed CPU tensor work with ``CPU_THREADS`` intra-op threads, restoring the
    previous count after (no effect on other devices; results do not depend on it: every
    reduction used here is exact or serial)."""
    before = torch.get_num_threads()
    if device.type != "cpu" or CPU_THREADS is None or before <= CPU_THREADS:
        yield
        return
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _flat(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().reshape(-1)
    return x if x.dtype == torch.float32 else x.float()


def _check(layer: str, lo: float, hi: float) -> None:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise CalibrationError("activation data contains NaN or Inf", layer=layer)


class Observer:
    """Common interface; ``layer`` names the layer in errors."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self._threads = 1    # threads for the histogram kernels: torch's count at update()

    def update(self, x: torch.Tensor) -> None:
        """Feed one batch of the layer's input (any shape and float dtype; computed in float32
        on its device, with the observers' CPU thread setting)."""
        xf = _flat(x)
        if xf.numel() == 0:
            return
        self._threads = torch.get_num_threads()
        with cpu_threads(xf.device):
            self._update(xf)

    def _update(self, xf: torch.Tensor) -> None:
        """Accumulate a non-empty flat float32 batch (subclasses)."""
        raise NotImplementedError

    def merge(self, other: "Observer") -> None:
        raise NotImplementedError

    def compute(self) -> Tuple[float, int]:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def load_state_dict(self, d: Dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def _empty(self) -> None:
        raise CalibrationError("no activation data was observed", layer=self.layer)


class _IfmrParams:
    def __init__(self, max_percentile: float, min_percentile: float, search_range, search_step: float,
                 asymmetric: bool) -> None:
        self.max_percentile = float(max_percentile)
        self.min_percentile = float(min_percentile)
        self.search_range = (float(search_range[0]), float(search_range[1]))
        self.search_step = float(search_step)
        self.asymmetric = bool(asymmetric)

    def kwargs(self) -> dict:
        return dict(max_percentile=self.max_percentile, min_percentile=self.min_percentile,
                    search_range=self.search_range, search_step=self.search_step,
                    asymmetric=self.asymmetric)


class IfmrExactObserver(Observer):
    """AMCT's store-everything IFMR: keeps every element (float32) and searches on all of it.
    Memory grows with batch_num; merge = concatenation (A then B)."""

    def __init__(self, layer: str, max_percentile: float = 0.999999, min_percentile: float = 0.999999,
                 search_range=(0.7, 1.3), search_step: float = 0.01, asymmetric: bool = True) -> None:
        super().__init__(layer)
        self.params = _IfmrParams(max_percentile, min_percentile, search_range, search_step, asymmetric)
        self.reset()

    def reset(self) -> None:
        self.chunks: List[torch.Tensor] = []

    def _update(self, xf: torch.Tensor) -> None:
        lo, hi = torch.aminmax(xf)
        _check(self.layer, *torch.stack([lo, hi]).tolist())
        self.chunks.append(xf.clone())

    def merge(self, other: "IfmrExactObserver") -> None:
        self.chunks.extend(other.chunks)

    def data(self) -> torch.Tensor:
        if not self.chunks:
            self._empty()
        if len(self.chunks) > 1:
            self.chunks = [torch.cat(self.chunks)]
        return self.chunks[0]

    def compute(self) -> Tuple[float, int]:
        r = ifmr_exact(self.data(), **self.params.kwargs())
        return r.scale, r.offset

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {"data": self.data() if self.chunks else torch.zeros(0)}

    def load_state_dict(self, d: Dict[str, torch.Tensor]) -> None:
        self.chunks = [d["data"].float().reshape(-1)] if d["data"].numel() else []


class IfmrStreamingObserver(Observer):
    """Memory-bounded IFMR: exact count, extremes and top/bottom-``TOPK`` values, plus a
    power-of-two-grid histogram with per-bin offset sums (see algorithms/histogram.py).
    Fixed size whatever batch_num is.

    Internally the histogram has one extra overflow slot (see ``histogram.accumulate``);
    ``counts``/``dsum`` fold it and return the ``nbins`` bins."""

    def __init__(self, layer: str, max_percentile: float = 0.999999, min_percentile: float = 0.999999,
                 search_range=(0.7, 1.3), search_step: float = 0.01, asymmetric: bool = True,
                 nbins: int = STREAM_BINS, topk: int = TOPK) -> None:
        super().__init__(layer)
        self.params = _IfmrParams(max_percentile, min_percentile, search_range, search_step, asymmetric)
        self.nbins = nbins
        self.topk = topk
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.top: Optional[torch.Tensor] = None      # descending, −inf padded
        self.bottom: Optional[torch.Tensor] = None   # ascending, +inf padded
        self._cnt: Optional[torch.Tensor] = None     # nbins + 1 (overflow slot)
        self._ds: Optional[torch.Tensor] = None      # float64
        self._thr = (-math.inf, math.inf)            # current K-th largest / smallest value
        self.frame = (0, 0)
        self.gmin = math.inf
        self.gmax = -math.inf

    def _settle(self) -> None:
        """Fold the overflow slot into the last bin."""
        histogram.fold_overflow(self._cnt, self._ds)

    @property
    def counts(self) -> Optional[torch.Tensor]:
        """Per-bin counts (int64, nbins), overflow folded."""
        if self._cnt is None:
            return None
        self._settle()
        return self._cnt[:self.nbins]

    @property
    def dsum(self) -> Optional[torch.Tensor]:
        """Per-bin sums of offsets in bin units (float64, nbins), overflow folded."""
        if self._cnt is None:
            return None
        self._settle()
        return self._ds[:self.nbins]

    def _set_hist(self, counts: torch.Tensor, dsum: torch.Tensor) -> None:
        dev = counts.device
        self._cnt = torch.cat([counts.to(torch.int64), torch.zeros(1, dtype=torch.int64, device=dev)])
        self._ds = torch.cat([dsum.double().to(dev), torch.zeros(1, dtype=torch.float64, device=dev)])

    def _candidates(self, rows: torch.Tensor, ext: torch.Tensor, tail: torch.Tensor,
                    largest: bool) -> torch.Tensor:
        """Values that can enter the top (or bottom) K, plus the ragged tail: the elements
        passing the current K-th value inside the chunks (rows) whose maxima (minima, ``ext``)
        pass it. When those chunks hold more than 16·K values, their 16-element groups are
        screened the same way first — and if more than K groups pass (the first batches), only
        the K with the largest maxima are kept: they provably hold the batch's part of the new
        top K (a value outside them has K larger group maxima above it)."""
        thr = self._thr[0] if largest else self._thr[1]
        sel = rows[ext > thr] if largest else rows[ext < thr]
        if sel.numel() > _GROUP * self.topk:
            groups = sel.view(-1, _GROUP)
            gext = groups.amax(dim=1) if largest else groups.amin(dim=1)
            passing = gext > thr if largest else gext < thr
            if int(passing.sum()) > self.topk:
                sel = groups[torch.topk(gext, self.topk, largest=largest, sorted=False).indices]
            else:
                sel = groups[passing]
        sel = sel.reshape(-1)
        sel = sel[sel > thr] if largest else sel[sel < thr]
        return torch.cat([sel, tail]) if tail.numel() else sel

    def _ensure(self, device: torch.device) -> None:
        if self.top is None:
            self.top = torch.full((self.topk,), -math.inf, device=device)
            self.bottom = torch.full((self.topk,), math.inf, device=device)
            self._cnt = torch.zeros(self.nbins + 1, dtype=torch.int64, device=device)   # + overflow slot
            self._ds = torch.zeros(self.nbins + 1, dtype=torch.float64, device=device)

    def _frame_for(self, gmin: float, gmax: float) -> Tuple[int, int]:
        """The frame after the global range becomes [gmin, gmax] (never finer than now)."""
        e, base = histogram.frame_for(gmin, gmax, self.nbins)
        if e < self.frame[0] and self.count:
            e = self.frame[0]
            base = math.floor(math.ldexp(gmin, -e))
        return e, base

    def _move_to(self, gmin: float, gmax: float) -> None:
        e, base = self._frame_for(gmin, gmax)
        if self.count and (e, base) != self.frame:
            self._set_hist(*histogram.reframe(self.counts, self.dsum, *self.frame, e, base))
        self.frame = (e, base)
        self.gmin, self.gmax = gmin, gmax

    def _fused_update(self, xf: torch.Tensor) -> bool:
        """An update in one compiled call (native.stream_update with the state to commit to):
        it bins the batch, merges the values passing the state's K-th values into the
        top/bottom buffers and adds the histogram — when the batch lies inside the current
        frame, the range it grows keeps the frame and its candidates fit (room for
        topk·_FINE_CHUNK a slice, _INSERT_MAX a side). Returns whether it committed, with
        exactly the state the torch path gives; False leaves the state untouched."""
        e, base = self.frame
        commit = native.Commit(self.gmin, self.gmax, e, self.nbins, histogram.REL_BITS, histogram.MIN_EXP,
                               self.top, self.bottom, self._cnt, self._ds, _INSERT_MAX)
        r = native.stream_update(xf, math.ldexp(1.0, -e), float(base), self.nbins + 1, histogram.OFFSET_BITS,
                                 self._thr[0], self._thr[1], self.topk * _FINE_CHUNK, histogram.MAX_SLICE,
                                 self._threads, commit)
        if not r.committed:
            return False
        self._thr = r.committed[:2]
        self.gmin, self.gmax = r.committed[2:]
        self.count += xf.numel()
        return True

    def _merge_extremes(self, above: torch.Tensor, below: torch.Tensor) -> None:
        """Fold a batch's candidate values into the exact top/bottom buffers (the general
        path; compiled updates merge theirs in the same call)."""
        if above.numel():
            self.top = torch.topk(torch.cat([self.top, above]), self.topk).values
        if below.numel():
            self.bottom = torch.topk(torch.cat([self.bottom, below]), self.topk, largest=False).values
        if above.numel() or below.numel():
            self._thr = (float(self.top[-1]), float(self.bottom[-1]))

    def _fold_bounds(self, m_hi: float, m_lo: float) -> None:
        """Fold a batch's bounds into the top/bottom buffers before its pass: ``m_hi`` is the
        K-th largest maximum and ``m_lo`` the K-th smallest minimum of its groups of values
        (∓inf with fewer than K groups; native.chunk_bounds).

        K groups each hold a value ≥ m_hi, so the top K of the state and the batch is the top
        K of the state, K copies of m_hi and the batch's values > m_hi, whatever the ties
        (post-ReLU data has thousands of groups whose minimum is 0). With the copies in, the
        state's K-th value is at least m_hi, so the pass collects only values > m_hi: fewer
        than K groups hold one, at most K·32 values, which the pass has room for. Likewise
        for the bottom. The copies stand for batch values, so the buffers stay right whatever
        path the batch then takes."""
        for buf, m, largest in ((self.top, m_hi, True), (self.bottom, m_lo, False)):
            if not (m > self._thr[0] if largest else m < self._thr[1]):
                continue
            if self.count == 0:
                buf.fill_(m)                      # the buffer held only its ∓inf padding
            else:
                native.insert_extremes(buf, torch.full((self.topk,), m), largest)
        self._thr = (float(self.top[-1]), float(self.bottom[-1]))

    def _widen(self, lo: float, hi: float) -> None:
        """Take a batch with extremes lo/hi (NaN/Inf checked): grow the range and frame."""
        _check(self.layer, lo, hi)
        if lo < self.gmin or hi > self.gmax:
            self._move_to(min(lo, self.gmin), max(hi, self.gmax))

    def _update(self, xf: torch.Tensor) -> None:
        self._ensure(xf.device)
        if native.usable(xf):
            # steady state: one compiled pass; the first batch (or one that leaves the frame)
            # first gets its extremes and the group bounds of its top/bottom K in another
            if self.count and self._fused_update(xf):
                return
            b = native.chunk_bounds(xf, _FINE_CHUNK, self.topk, self._threads)
            self._widen(b.lo, math.nan if b.nans else b.hi)
            self._fold_bounds(b.kth_hi, b.kth_lo)
            if self._fused_update(xf):
                return
        n = xf.numel()
        full = n // _CHUNK * _CHUNK
        rows = xf[:full].view(-1, _CHUNK) if full < n else xf.view(-1, _CHUNK)
        tail = xf[full:]
        # chunk extremes (amax and amin: two vectorised passes, ~8× faster than one
        # aminmax(dim=1)) give the batch's range in one host read; only when it passes the
        # current K-th values are the chunks that can enter the top/bottom K gathered
        if full:
            ext_hi, ext_lo = rows.amax(dim=1), rows.amin(dim=1)
            hi_src = torch.cat([ext_hi, tail]) if tail.numel() else ext_hi
            lo_src = torch.cat([ext_lo, tail]) if tail.numel() else ext_lo
        else:
            ext_hi = ext_lo = xf.new_zeros(0)
            hi_src = lo_src = tail
        hi_f, lo_f = torch.stack([hi_src.max(), lo_src.min()]).tolist()
        self._widen(lo_f, hi_f)
        self._merge_extremes(self._candidates(rows, ext_hi, tail, True) if hi_f > self._thr[0] else xf[:0],
                             self._candidates(rows, ext_lo, tail, False) if lo_f < self._thr[1] else xf[:0])
        histogram.accumulate(xf, *self.frame, self._cnt, self._ds, self._threads)
        self.count += n

    def merge(self, other: "IfmrStreamingObserver") -> None:
        if other.count == 0:
            return
        if self.count == 0:
            self.load_state_dict(other.state_dict())
            return
        with cpu_threads(self.top.device):
            self.top = torch.topk(torch.cat([self.top, other.top.to(self.top.device)]), self.topk).values
            self.bottom = torch.topk(torch.cat([self.bottom, other.bottom.to(self.top.device)]), self.topk,
                                     largest=False).values
            self._thr = tuple(torch.stack([self.top[-1], self.bottom[-1]]).tolist())
            self._move_to(min(self.gmin, other.gmin), max(self.gmax, other.gmax))
            dev = self._cnt.device
            oc, od = histogram.reframe(other.counts.to(dev), other.dsum.to(dev), *other.frame, *self.frame)
            self._cnt[:self.nbins] += oc
            self._ds[:self.nbins] += od
            self.count += other.count

    def compute(self) -> Tuple[float, int]:
        if self.count == 0:
            self._empty()
        e, base = self.frame
        with cpu_threads(self._cnt.device):
            r = ifmr_from_histogram(self.count, self.top, self.bottom,
                                    histogram.bin_starts(e, base, self.nbins, self._cnt.device),
                                    math.ldexp(1.0, e), self.counts, self.dsum * math.ldexp(1.0, e),
                                    **self.params.kwargs())
        return r.scale, r.offset

    def state_dict(self) -> Dict[str, torch.Tensor]:
        if self.count == 0:
            return {"count": torch.zeros((), dtype=torch.int64)}
        return {"count": torch.tensor(self.count, dtype=torch.int64), "top": self.top, "bottom": self.bottom,
                "counts": self.counts, "dsum": self.dsum,
                "frame": torch.tensor(self.frame, dtype=torch.int64),
                "range": torch.tensor([self.gmin, self.gmax], dtype=torch.float64)}

    def load_state_dict(self, d: Dict[str, torch.Tensor]) -> None:
        self.reset()
        self.count = int(d["count"])
        if self.count:
            self.top, self.bottom = d["top"].float().clone(), d["bottom"].float().clone()
            self._thr = tuple(torch.stack([self.top[-1], self.bottom[-1]]).tolist())
            self._set_hist(d["counts"], d["dsum"].to(d["counts"].device))
            self.topk, self.nbins = self.top.numel(), d["counts"].numel()
            self.frame = tuple(int(v) for v in d["frame"].tolist())
            self.gmin, self.gmax = (float(v) for v in d["range"].tolist())


class HfmgObserver(Observer):
    """HFMG: a ``num_of_bins`` histogram whose range follows SPEC §5.3's sequential rule.

    ``merge`` of a histogram built on another range redistributes *both* histograms onto the
    union range with the same rule (floor lower share) and adds them; counts are preserved
    exactly, bin positions approximately (docs/algorithms.md measures the deviation)."""

    def __init__(self, layer: str, num_of_bins: int = 4096, asymmetric: bool = True) -> None:
        super().__init__(layer)
        self.nbins = int(num_of_bins)
        self.asymmetric = bool(asymmetric)
        self.reset()

    def reset(self) -> None:
        self.counts: Optional[torch.Tensor] = None
        self.mn = math.inf
        self.mx = -math.inf

    def _update(self, xf: torch.Tensor) -> None:
        if native.usable(xf):
            # one compiled pass bins a batch that lies inside the current range; one that
            # widens it (or the first) comes back with its extremes and is binned again below
            mn, mx = (self.mn, self.mx) if self.counts is not None and self.mx > self.mn else (math.inf, -math.inf)
            r = native.hfmg_pass(xf, mn, mx, hfmg.bin_width(mn, mx, self.nbins) if mx > mn else 0.0,
                                 self.nbins, self._threads, into=self.counts if mx > mn else None)
            if not r.outside:
                return
            lo, hi = min(r.lo, mn), max(r.hi, mx)     # the batch's extremes, or beyond them
            _check(self.layer, lo, math.nan if r.nans else hi)
        else:
            lo, hi = torch.stack(list(torch.aminmax(xf))).tolist()
            _check(self.layer, lo, hi)
        if self.counts is None:
            self.mn, self.mx = lo, hi
            self.counts = hfmg.histogram(xf, lo, hi, self.nbins, self._threads)
            return
        nmn, nmx = min(self.mn, lo), max(self.mx, hi)
        self.counts = hfmg.redistribute(self.counts, self.mn, self.mx, nmn, nmx)
        self.mn, self.mx = nmn, nmx
        hfmg.add_histogram(self.counts, xf, nmn, nmx, self._threads)

    def merge(self, other: "HfmgObserver") -> None:
        if other.counts is None:
            return
        if self.counts is None:
            self.load_state_dict(other.state_dict())
            return
        nmn, nmx = min(self.mn, other.mn), max(self.mx, other.mx)
        mine = hfmg.redistribute(self.counts, self.mn, self.mx, nmn, nmx)
        theirs = hfmg.redistribute(other.counts.to(self.counts.device), other.mn, other.mx, nmn, nmx)
        self.counts = mine + theirs
        self.mn, self.mx = nmn, nmx

    def compute(self) -> Tuple[float, int]:
        if self.counts is None:
            self._empty()
        threads = torch.get_num_threads()
        with cpu_threads(self.counts.device):
            r = hfmg.hfmg_factors(self.counts, self.mn, self.mx, self.asymmetric, threads)
        return r.scale, r.offset

    def state_dict(self) -> Dict[str, torch.Tensor]:
        if self.counts is None:
            return {"counts": torch.zeros(0, dtype=torch.int64)}
        return {"counts": self.counts, "range": torch.tensor([self.mn, self.mx], dtype=torch.float64)}

    def load_state_dict(self, d: Dict[str, torch.Tensor]) -> None:
        self.reset()
        if d["counts"].numel():
            self.counts = d["counts"].to(torch.int64).clone()
            self.nbins = self.counts.numel()
            self.mn, self.mx = (float(v) for v in d["range"].tolist())


def make_observer(layer_name: str, cfg, ifmr_mode: str = "streaming") -> Observer:
    """Observer for one quantized input from a per-layer config (attributes act_algo,
    max_percentile, min_percentile, search_range, search_step, num_of_bins, asymmetric);
    ``ifmr_mode`` "streaming" (default, memory-bounded) or "exact" (AMCT's store-everything)."""
    algo = getattr(cfg, "act_algo", "ifmr")
    if algo == "hfmg":
        return HfmgObserver(layer_name, num_of_bins=cfg.num_of_bins, asymmetric=cfg.asymmetric)
    if algo != "ifmr":
        raise CalibrationError(f"unknown activation algorithm {algo!r}", layer=layer_name)
    kw = dict(max_percentile=cfg.max_percentile, min_percentile=cfg.min_percentile,
              search_range=tuple(cfg.search_range), search_step=cfg.search_step, asymmetric=cfg.asymmetric)
    if ifmr_mode == "exact":
        return IfmrExactObserver(layer_name, **kw)
    if ifmr_mode != "streaming":
        raise CalibrationError(f"unknown IFMR mode {ifmr_mode!r}", layer=layer_name)
    return IfmrStreamingObserver(layer_name, **kw)
