"""Optional compiled CPU kernels for the observers (``hist_kernels.c``): the histograms of
streaming IFMR and HFMG, and the IFMR and HFMG searches.

Why: on the CPU the torch formulas cost several passes over the data per batch; the C kernels
read each element once and run on torch's own OpenMP threads. The histograms are the same
integers as the torch formulas (tested bit for bit), the search losses agree to 1e-12. Built
once per machine (``build.py``); without them the torch ops run, with one warning, and
``AMCT_TORCH_NATIVE=0`` turns them off. Every wrapper checks the tensors it hands to C so that no
caller can make a kernel read or write out of bounds. docs/algorithms.md, "Compiled kernels"."""
from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from typing import NamedTuple, Optional

import torch

from amct_torch.kernels import build as native_build

log = logging.getLogger("amct_torch")

#: scratch slots after a histogram buffer that the kernels use for exact zeros (AMCT_TRASH)
TRASH = 8
#: below this many elements per thread a call stays on one thread
MIN_PER_THREAD = 1 << 15
#: most elements of one HFMG slice (its private counts are int32)
HFMG_MAX_SLICE = (1 << 31) - 1

_lock = threading.Lock()
_state: dict = {}


def _load() -> Optional[native_build.KernelLibrary]:
    if native_build.turned_off():
        _state["why"] = "turned off by AMCT_TORCH_NATIVE"
        return None
    cc = native_build.find_compiler()
    if cc is None:
        env = os.environ.get("CC")
        _state["why"] = (f"the compiler CC={env!r} was not found" if env
                         else "no C compiler found (cc, gcc, clang; or set CC)")
        return None
    return native_build.load_library(cc)


def library() -> Optional[native_build.KernelLibrary]:
    """The loaded kernels, or None (then ``unavailable_reason()`` says why). Built and
    self-checked once per process."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    lib = _load()
                    if lib is not None:
                        _state["lib"] = lib       # the self-check calls the kernels through library()
                        problem = self_check()
                        if problem:
                            native_build.discard(lib._amct_path)     # never reused
                            lib = None
                            _state["why"] = f"self-check failed: {problem}"
                except Exception as exc:  # noqa: BLE001 - a build problem must never stop a calibration
                    lib = None
                    _state["why"] = f"build failed: {exc}"
                _state["lib"] = lib
                if lib is None:
                    log.info("native histogram kernels unavailable (%s); using torch ops", _state.get("why"))
    return _state["lib"]


def _lib() -> ctypes.CDLL:
    """The loaded kernels for a wrapper below; callers check ``library()`` first, so None here
    is a caller's bug, reported with the reason the kernels are missing."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the CPU kernels are not loaded ({unavailable_reason()})")
    return lib


def unavailable_reason() -> Optional[str]:
    """Why ``library()`` is None (None when it is loaded or not tried yet)."""
    return None if _state.get("lib") is not None else _state.get("why")


def slice_bounds(n: int, max_slice: int, threads: int, slots: int = 0) -> torch.Tensor:
    """int64 [pieces + 1] bounds of contiguous slices of n elements, none longer than
    ``max_slice``: one per thread, as long as each has ``MIN_PER_THREAD`` elements and there
    are at most √(n / slots) slices — each slice zeroes and decodes a private histogram of
    ``slots`` entries, and with per-element cost e and per-slot cost ~e, p slices cost about
    n·e/p + p·slots·e: least near p = √(n / slots) (on many cores a small tensor would
    otherwise spend more on histograms than on its elements). When the length limit asks
    for more slices than workers, their number is a multiple of the workers', so that every
    thread gets the same share (16M values on 2 threads: 4 slices, not 3 — one thread would
    have run twice as long as the other)."""
    key = (n, max_slice, threads, slots)
    bounds = _BOUNDS.get(key)
    if bounds is None:
        cap = math.isqrt(n // slots) if slots else n
        workers = max(1, min(threads, n // MIN_PER_THREAD, cap))
        pieces = -(-max(workers, -(-n // max_slice), 1) // workers) * workers
        bounds = torch.linspace(0, n, pieces + 1, dtype=torch.float64).round().to(torch.int64)
        if len(_BOUNDS) > 4096:
            _BOUNDS.clear()
        _BOUNDS[key] = bounds
    return bounds


#: slice bounds by (n, max_slice, threads, slots): calibration sees the same few sizes each
#: batch (read-only tensors, shared by threads)
_BOUNDS: dict = {}


_buffers = threading.local()


def _row(entries: int, size: int) -> int:
    """Entries per row of a per-slice histogram buffer: whole 64-byte cache lines (entries of
    ``size`` bytes), so that two threads never write the same line — the last slots of a row
    (the trash of the zeros) are its busiest (measured: 1.6× slower HFMG passes on two
    threads with int32 rows that shared a line)."""
    per_line = 64 // size
    return -(-entries // per_line) * per_line


def _buffer(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A scratch tensor reused across calls (per thread): the kernels zero what they need,
    and their results are consumed before the next call. Saves a 0.1–0.6 MB allocation per
    update (a small layer's update is dominated by such fixed costs); the view of each shape
    is kept too (making one costs two tensor ops)."""
    cache = getattr(_buffers, "cache", None)
    if cache is None:
        cache = _buffers.cache = {}
    view = cache.get((name, shape, dtype))
    if view is not None:
        return view
    numel = math.prod(shape)
    t = cache.get(name)
    if t is None or t.numel() < numel or t.dtype != dtype:   # grows to the largest use
        for key in [k for k in cache if isinstance(k, tuple) and k[0] == name]:
            del cache[key]                                # views of the old storage
        t = cache[name] = torch.empty(numel, dtype=dtype)
    if len(cache) > 512:                                  # many shapes (varying input sizes)
        for key in [k for k in cache if isinstance(k, tuple)]:
            del cache[key]
    view = cache[(name, shape, dtype)] = t[:numel].view(shape)
    return view


def add_packed(acc: torch.Tensor, counts: torch.Tensor, dsum: torch.Tensor, offset_bits: int,
               threads: int = 1) -> None:
    """``histogram.add_packed`` in one kernel call (same arithmetic) for CPU state tensors
    (int64 ``counts``, float64 ``dsum``, contiguous), slot blocks on ``threads`` threads."""
    if not (acc.dim() == 2 and acc.dtype == torch.int64 and acc.stride(1) == 1 and acc.device.type == "cpu"):
        raise ValueError("add_packed takes int64 CPU rows of packed entries")
    _check(counts, torch.int64, acc.shape[1], "add_packed counts")
    _check(dsum, torch.float64, acc.shape[1], "add_packed offset sums")
    _lib().amct_add_packed(acc.shape[0], acc.data_ptr(), acc.stride(0), acc.shape[1], offset_bits,
                              counts.data_ptr(), dsum.data_ptr(), _decode_threads(threads, acc.shape[1]))


def _decode_threads(threads: int, slots: int) -> int:
    """Threads for decoding histograms of ``slots`` entries (a 4096-slot block each at least)."""
    return max(1, min(threads, slots // 4096))


def insert_extremes(buf: torch.Tensor, cand: torch.Tensor, largest: bool) -> None:
    """Fold ``cand`` into ``buf`` in place: buf holds the k largest values seen, sorted
    descending (``largest``), or the k smallest ascending — the values of
    ``torch.topk(torch.cat([buf, cand]), k, largest)`` (ties are equal values). Both contiguous
    float32 CPU, NaN-free."""
    _check(buf, torch.float32, None, "insert_extremes buffer")
    _check(cand, torch.float32, None, "insert_extremes candidates")
    cand = cand.clone()                                   # the kernel reorders it
    if _lib().amct_insert_extremes(buf.data_ptr(), buf.numel(), cand.data_ptr(), cand.numel(), int(largest)):
        raise MemoryError("no memory to merge the streaming IFMR candidates")


def frame_for(gmin: float, gmax: float, nbins: int, rel_bits: int, min_exp: int, e_floor: int) -> tuple[int, int]:
    """``amct_frame_for``: the C twin of ``histogram.frame_for`` (with the frame's exponent as
    a floor, as ``IfmrStreamingObserver._frame_for``) that a committing update uses; for the
    tests, which hold the two to the same answers."""
    out = (ctypes.c_int64 * 2)()
    _lib().amct_frame_for(gmin, gmax, nbins, rel_bits, min_exp, e_floor, out)
    return int(out[0]), int(out[1])


def _check_input(x: torch.Tensor) -> None:
    if not (x.is_contiguous() and x.dtype == torch.float32 and x.device.type == "cpu"):
        raise ValueError("the histogram kernels take contiguous float32 CPU tensors")


def _check(t: torch.Tensor, dtype: torch.dtype, numel: Optional[int], what: str) -> None:
    """The boundary check of every tensor handed to C: CPU, ``dtype``, contiguous and (when
    given) exactly ``numel`` elements — a wrong length from an untrusted state must be an
    error here, never a read or write past a buffer in C."""
    if not (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()
            and (numel is None or t.numel() == numel)):
        got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{what}: expected a contiguous CPU {dtype} tensor"
                         + (f" of {numel} elements" if numel is not None else "") + f", got {got}")


class UpdateResult(NamedTuple):
    """What ``stream_update`` found, over all slices."""

    acc: torch.Tensor        # packed accumulators, int64 [pieces, slots] (reused buffer; when
                             # committed, already decoded: the whole rows, trash included)
    outside: int             # elements outside the frame, NaN or Inf (then nothing is valid)
    #: see Commit: the state's new (K-th top value, K-th bottom value, gmin, gmax)
    committed: Optional[tuple[float, float, float, float]] = None


class Commit(NamedTuple):
    """A streaming-IFMR state that ``stream_update`` may update in the same call (the steady
    case: the grown range keeps the frame, at most ``insert_max`` candidates per side): its
    range, frame exponent, bin count and frame rule (``histogram.REL_BITS``/``MIN_EXP``), its
    sorted top/bottom buffers and its counts/offset sums (contiguous CPU float32 / int64 /
    float64)."""

    gmin: float
    gmax: float
    e: int
    nbins: int
    rel_bits: int
    min_exp: int
    top: torch.Tensor
    bottom: torch.Tensor
    counts: torch.Tensor
    dsum: torch.Tensor
    insert_max: int


def stream_update(x: torch.Tensor, s: float, base: float, slots: int, offset_bits: int,
                  thr_hi: float, thr_lo: float, cap: int, max_slice: int, threads: int = 1,
                  commit: Optional[Commit] = None) -> UpdateResult:
    """The fused streaming-IFMR pass (``amct_stream_update``) over slices of ``x``: the packed
    histogram, and the values above ``thr_hi`` / below ``thr_lo`` (at most ``cap`` a slice) —
    which, with ``commit``, are folded into that state in the same call together with the
    histogram when they fit (``amct_stream_step``: then ``committed`` says so; else the
    state is untouched and the caller takes another path). Without ``commit`` (a plain
    histogram: infinite thresholds) the caller decodes ``acc``."""
    _check_input(x)
    bounds = slice_bounds(x.numel(), max_slice, threads, slots)
    pieces = bounds.numel() - 1
    nt = min(pieces, threads)
    stride = _row(slots + TRASH, 8)
    acc = _buffer("acc", (pieces, stride), torch.int64)
    cand = _buffer("cand", (pieces, 2, cap + 1), torch.float32)
    res = _buffer("res", (pieces, 3), torch.int64)
    ext = _buffer("ext", (pieces + 2, 2), torch.float32)     # + what a commit reports
    lib = _lib()
    if commit is not None:
        c = commit
        if slots != c.nbins + 1 or c.top.numel() < 1:
            raise ValueError(f"stream_update: {slots} slots for a state of {c.nbins} bins")
        _check(c.top, torch.float32, c.top.numel(), "stream_update top buffer")
        _check(c.bottom, torch.float32, c.top.numel(), "stream_update bottom buffer")
        _check(c.counts, torch.int64, slots, "stream_update counts")
        _check(c.dsum, torch.float64, slots, "stream_update offset sums")
        done = lib.amct_stream_step(pieces, nt, x.data_ptr(), bounds.data_ptr(), s, base, slots, offset_bits,
                                    acc.data_ptr(), stride, thr_hi, thr_lo, cand.data_ptr(), cap,
                                    res.data_ptr(), ext.data_ptr(), c.gmin, c.gmax, c.e, c.nbins, c.rel_bits,
                                    c.min_exp, c.insert_max, c.top.data_ptr(), c.bottom.data_ptr(), c.top.numel(),
                                    c.counts.data_ptr(), c.dsum.data_ptr(), _decode_threads(threads, slots),
                                    ext[pieces].data_ptr())
        if done < 0:
            raise MemoryError("no memory to merge the streaming IFMR candidates")
        if done:                          # the accumulators are decoded: no view of them
            return UpdateResult(acc, 0, tuple(ext[pieces:].reshape(-1).tolist()))
    else:
        lib.amct_stream_update_mt(pieces, nt, x.data_ptr(), bounds.data_ptr(), s, base, slots, offset_bits,
                                  acc.data_ptr(), stride, thr_hi, thr_lo, cand.data_ptr(), cap,
                                  res.data_ptr(), ext.data_ptr())
    return UpdateResult(acc[:, :slots], int(res[:, 2].sum()))


class ChunkBounds(NamedTuple):
    """What ``chunk_bounds`` found."""

    hi: float                # the data's extremes (NaN left out)
    lo: float
    kth_hi: float            # the k-th largest group maximum (−inf with fewer than k groups)
    kth_lo: float            # the k-th smallest group minimum (+inf likewise)
    nans: int


def chunk_bounds(x: torch.Tensor, chunk: int, k: int, threads: int = 1) -> ChunkBounds:
    """``amct_chunk_bounds``: x's extremes and the k-th largest maximum / smallest minimum of
    its groups of ``chunk`` values (not contiguous: see the kernel) — the first batch's bound
    for the exact top/bottom-k buffers (``IfmrStreamingObserver._fold_bounds``), in one pass on
    ``threads`` threads."""
    _check_input(x)
    n = x.numel()
    scratch = _buffer("chunk_ext", (2, n // chunk + 8), torch.float32)
    res = _buffer("chunk_res", (4,), torch.float32)
    nan = _buffer("chunk_nan", (1,), torch.int64)
    nt = max(1, min(threads, n // MIN_PER_THREAD))
    _lib().amct_chunk_bounds(nt, x.data_ptr(), n, chunk, k, scratch[0].data_ptr(), scratch[1].data_ptr(),
                                res.data_ptr(), nan.data_ptr())
    hi, lo, kth_hi, kth_lo = res.tolist()
    return ChunkBounds(hi, lo, kth_hi, kth_lo, int(nan[0]))


class HfmgPass(NamedTuple):
    """What ``hfmg_pass`` found."""

    counts: Optional[torch.Tensor]   # int64 [nbins] over [mn, mx]; None when ``outside`` or added
    lo: float                        # when ``outside``: with [mn, mx], the data's extremes
    hi: float                        # (NaN left out; see amct_hfmg_hist)
    outside: bool                    # some value lies outside [mn, mx] (or is NaN)
    nans: int


def hfmg_pass(x: torch.Tensor, mn: float, mx: float, w: float, nbins: int, threads: int = 1,
              into: Optional[torch.Tensor] = None) -> HfmgPass:
    """One pass of ``amct_hfmg_hist``: the HFMG counts of ``x`` on [mn, mx] with bin width
    ``w`` (see ``hfmg.histogram``) — added to ``into`` (contiguous int64 [nbins]) when given,
    else returned — or, when a value lies outside [mn, mx] (the batch widens the range;
    mn > mx: no range yet), the extremes: min(mn, lo) and max(mx, hi) are the union of
    [mn, mx] and x's range."""
    _check_input(x)
    if mn <= mx and not (w > 0 and math.isfinite(w)):
        raise ValueError(f"hfmg_pass needs a positive bin width for the range [{mn}, {mx}], got {w}")
    if into is not None and not (into.is_contiguous() and into.dtype == torch.int64 and into.numel() == nbins
                                 and into.device.type == "cpu"):
        raise ValueError("hfmg_pass adds into a contiguous int64 CPU tensor of nbins counts")
    bounds = slice_bounds(x.numel(), HFMG_MAX_SLICE, threads, nbins)
    pieces = bounds.numel() - 1
    stride = 2 * _row(nbins + TRASH, 4)           # two copies a slice (scatter_count2)
    cnt = _buffer("hfmg", (pieces, stride), torch.int32)
    ext = _buffer("hfmg_ext", (pieces, 2), torch.float32)
    res = _buffer("hfmg_res", (pieces, 2), torch.int64)
    _lib().amct_hfmg_hist_mt(pieces, min(pieces, threads), x.data_ptr(), bounds.data_ptr(), mn, mx, w, nbins,
                                cnt.data_ptr(), stride, ext.data_ptr(), res.data_ptr(),
                                None if into is None else into.data_ptr())
    flags, ends = res.tolist(), ext.tolist()
    outside, nans = any(f[0] for f in flags), sum(f[1] for f in flags)
    counts = None
    if not outside and into is None:
        counts = cnt[:, :nbins].sum(0, dtype=torch.int64)              # a new tensor, not the buffer
    return HfmgPass(counts, min(e[0] for e in ends), max(e[1] for e in ends), outside, nans)


def set_isa(want: int) -> int:
    """Vector width of the kernels: 0 the 4-lane code, -1 the widest the CPU has; returns
    the choice in use (0: 4 lanes, 1: AVX2). For the tests, which run both."""
    return int(_lib().amct_set_isa(want))


def hfmg_losses(pref: torch.Tensor, cnt: torch.Tensor, lefts: torch.Tensor, rights: torch.Tensor,
                width: float, flt_eps: float, threads: int = 1, int64_only: bool = False) -> torch.Tensor:
    """``hfmg.losses`` per candidate in one kernel (``amct_hfmg_losses``): the same formula,
    float64 sums in another order (agree to ~1e-13 relative; tested). ``pref`` int64
    [3, n + 1] prefix moments, ``cnt`` int64 [n + 1] (last entry 0). While the moments stay
    exact in float64 (4·Σc·n² < 2^53) four candidates go through a vector at once; the
    per-candidate int64 code (``int64_only``, and beyond that bound) gives the same bits."""
    pref, cnt = pref.contiguous(), cnt.contiguous()
    lefts = lefts.to(torch.int64).contiguous()
    rights = rights.to(torch.int64).contiguous()
    n = cnt.numel() - 1
    _check(cnt, torch.int64, None, "hfmg_losses counts")
    _check(pref, torch.int64, 3 * (n + 1), "hfmg_losses prefix moments")
    _check(rights, torch.int64, lefts.numel(), "hfmg_losses right bounds")
    if lefts.device.type != "cpu" or (
            lefts.numel() and not bool(((lefts >= 0) & (lefts <= rights) & (rights < n)).all())):
        raise ValueError("hfmg_losses: candidate ranges must satisfy 0 <= left <= right < bins")
    out = torch.empty(lefts.numel(), dtype=torch.float64)
    _lib().amct_hfmg_losses(pref.data_ptr(), cnt.data_ptr(), cnt.numel() - 1, lefts.data_ptr(),
                               rights.data_ptr(), lefts.numel(), width, flt_eps, out.data_ptr(),
                               max(1, min(threads, lefts.numel() // 64)), int(int64_only))
    return out


def ifmr_hist_losses(counts: torch.Tensor, dsum: torch.Tensor, start: float, width: float,
                     m_lo: torch.Tensor, k: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``ifmr.histogram_losses`` per candidate (``amct_ifmr_hist_losses``, which also builds
    the prefix sums): the same float64 operations per boundary, summed over levels in order
    (the tensor version sums in another order; they agree to ~1e-15 relative, tested).
    ``counts`` int64, ``dsum`` (offset sums, absolute units) and the candidates' float64
    level ranges and steps, all CPU."""
    counts = counts.to(torch.int64).contiguous()
    dsum = dsum.double().contiguous()
    m_lo, k, s = (t.double().contiguous() for t in (m_lo, k, s))
    _check(counts, torch.int64, None, "ifmr_hist_losses counts")
    _check(dsum, torch.float64, counts.numel(), "ifmr_hist_losses offset sums")
    _check(k, torch.float64, m_lo.numel(), "ifmr_hist_losses level counts")
    _check(s, torch.float64, m_lo.numel(), "ifmr_hist_losses steps")
    out = torch.empty(m_lo.numel(), dtype=torch.float64)
    if _lib().amct_ifmr_hist_losses(counts.data_ptr(), dsum.data_ptr(), counts.numel(), start, width,
                                       m_lo.data_ptr(), k.data_ptr(), s.data_ptr(), m_lo.numel(), out.data_ptr()):
        raise MemoryError("no memory for the IFMR prefix sums")
    return out


def hfmg_walk(counts: torch.Tensor):
    """(lefts, rights): the candidate ranges of the HFMG greedy walk, in walk order
    (``amct_hfmg_walk``, the literal loop with bisection; int64 CPU tensors)."""
    n = counts.numel()
    pre = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(counts.to(torch.int64).cpu(), 0, out=pre[1:])
    lefts = torch.empty(max(n, 1), dtype=torch.int64)
    rights = torch.empty(max(n, 1), dtype=torch.int64)
    k = _lib().amct_hfmg_walk(pre.data_ptr(), n, lefts.data_ptr(), rights.data_ptr())
    return lefts[:k], rights[:k]


def hfmg_redistribute(counts: torch.Tensor, old_min: float, old_max: float, new_min: float,
                      new_max: float) -> torch.Tensor:
    """``hfmg.redistribute`` for an int64 CPU histogram with old_max > old_min
    (``amct_hfmg_redistribute``: the same float64 operations, so the same integers)."""
    counts = counts.contiguous()
    _check(counts, torch.int64, None, "hfmg_redistribute counts")
    out = torch.empty_like(counts)
    _lib().amct_hfmg_redistribute(counts.data_ptr(), counts.numel(), old_min, old_max, new_min, new_max,
                                     out.data_ptr())
    return out


def self_check() -> Optional[str]:
    """Compare the kernels, at every vector width the CPU has, with the torch formulas on
    awkward data (exact zeros, both signs, bin edges, the top edge, a tiny range); a
    description of the first mismatch, or None. Guards against a compiler that would not
    honour the flags (e.g. contract to FMA). Leaves the widest width chosen."""
    from amct_torch.algorithms import hfmg, histogram
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50001, generator=g) * 3            # odd: the vector blocks' scalar tails too
    x[::7] = 0.0
    x[1::11] = torch.round(x[1::11] * 64) / 64          # values on power-of-two bin edges
    x[5] = float(x.max()) * 1.0000001
    tiny = (torch.rand(3000, generator=g) * 1e-30).float()
    widths = [0] + ([1] if set_isa(-1) else [])
    try:
        for isa in widths:
            set_isa(isa)
            for data in (x, torch.relu(x), tiny):
                lo, hi = float(data.min()), float(data.max())
                e, base = histogram.frame_for(lo, hi, 4096)
                s = math.ldexp(1.0, -e)
                want = histogram.packed_slice(data, s, float(base), 4097)
                got = stream_update(data, s, float(base), 4097, histogram.OFFSET_BITS, math.inf, -math.inf, 0, 1 << 30)
                if got.outside or not torch.equal(got.acc[0], want):
                    return f"streaming IFMR histogram differs from the torch formula (vector width {isa})"
                first = hfmg_pass(data, math.inf, -math.inf, 0.0, 2048, threads=2)   # extremes only
                if (first.lo, first.hi) != (lo, hi):
                    return f"HFMG extremes differ from torch's (vector width {isa})"
                if hi > lo:
                    r = hfmg_pass(data, lo, hi, hfmg.bin_width(lo, hi, 2048), 2048, threads=2)
                    if r.outside or r.counts is None or not torch.equal(r.counts, hfmg.histogram(data, lo, hi, 2048)):
                        return f"HFMG histogram differs from the torch formula (vector width {isa})"
    finally:
        set_isa(-1)
    return None
