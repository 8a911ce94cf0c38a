"""Observers: one small mergeable state per quantized input, with ``update``, ``merge``,
``compute() -> (scale, offset)``, ``state_dict``/``load_state_dict`` (checked: a wrong shape,
dtype or impossible value is a ``CalibrationError``) and ``reset``.

Why no host read in ``update``: on a GPU every Python-side look at the data stalls the stream.
The state is tensors on the data's device, every per-batch decision is a fixed-shape tensor op,
and NaN/Inf only sets a device flag that ``compute`` (one read-back) turns into an error naming
the layer. The heavy operations go through the device's backend (``backends.py``).
docs/algorithms.md, "Observers"."""
from __future__ import annotations

import math
from typing import NoReturn, Optional, TypeVar

import torch

from amct_torch.algorithms import hfmg, histogram
from amct_torch.algorithms.ifmr import ifmr_exact, ifmr_from_histogram
from amct_torch.algorithms.streaming import StreamState
from amct_torch.calibration.backends import backend_for, cpu_threads
from amct_torch.config.act_algos import ACT_ALGORITHMS, DEFAULT
from amct_torch.errors import CalibrationError

#: exact top-k/bottom-k buffer size of streaming IFMR (covers k ≤ 1024, i.e. L ≤ ~1e9 at p = 0.999999)
TOPK = 1024
#: bins of the streaming IFMR histogram
STREAM_BINS = 16384
#: most elements a state may claim (beyond it int64 sums could overflow)
MAX_COUNT = 1 << 56

_O = TypeVar("_O", bound="Observer")


def _flat(x: torch.Tensor, order_free: bool = False) -> torch.Tensor:
    """``x`` as a flat float32 tensor. ``order_free`` (statistics that do not depend on the
    order of the elements): a channels-last batch is flattened in its memory order, a view
    instead of a copy of the whole activation."""
    x = x.detach()
    if order_free and x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        x = x.permute(0, 2, 3, 1)
    x = x.reshape(-1)
    return x if x.dtype == torch.float32 else x.float()


class Observer:
    """Common interface; ``layer`` names the layer in errors."""

    #: the statistics do not depend on the order of the elements (histograms, extremes)
    order_free = False

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self._batch = 0                              # host-side count of updates (no device read)
        self._bad: Optional[torch.Tensor] = None     # 0-d bool on the device: NaN/Inf seen
        self._first_bad: Optional[torch.Tensor] = None

    def update(self, x: torch.Tensor, batch: Optional[int] = None) -> None:
        """Feed one batch of the layer's input (any shape and float dtype; computed in float32
        on its device) without reading anything back. ``batch``: the calibration batch's
        number (0-based) for the NaN/Inf message; default the count of updates."""
        xf = _flat(x, self.order_free)
        index = self._batch if batch is None else batch
        self._batch += 1
        if xf.numel() == 0:
            return
        self._flag(self._update(xf), index)

    def _flag(self, bad: Optional[torch.Tensor], index: int) -> None:
        """Remember (on the device) whether this batch held NaN/Inf, and the first such batch
        (``bad`` None: a CPU backend saw on the host that the batch was clean)."""
        if bad is None:
            return
        if self._bad is None or self._first_bad is None:  # set together
            self._bad = torch.zeros((), dtype=torch.bool, device=bad.device)
            self._first_bad = torch.full((), -1, dtype=torch.int64, device=bad.device)
        bad = bad.to(self._bad.device)
        self._first_bad.copy_(torch.where(bad & ~self._bad, torch.full_like(self._first_bad, index), self._first_bad))
        self._bad.logical_or_(bad)

    def _raise_if_bad(self) -> None:
        """The one read-back of the flag: raise naming the layer and the first bad batch."""
        if self._bad is None or self._first_bad is None:
            return
        bad, first = torch.stack([self._bad.to(torch.int64), self._first_bad]).tolist()
        if bad:
            raise CalibrationError(f"activation data contains NaN or Inf (first in calibration batch {first + 1})",
                                   layer=self.layer)

    def _update(self, xf: torch.Tensor) -> torch.Tensor:
        """Accumulate a non-empty flat float32 batch; return a 0-d bool NaN/Inf flag."""
        raise NotImplementedError

    def merge(self: _O, other: _O) -> None:
        """Fold in another observer of the same kind."""
        raise NotImplementedError

    def compute(self) -> tuple[float, int]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def _empty(self) -> NoReturn:
        raise CalibrationError("no activation data was observed", layer=self.layer)

    def _merge_flags(self, other: Observer) -> None:
        """Fold another observer's NaN/Inf flag and first bad batch into ours."""
        if other._bad is None or other._first_bad is None:
            return
        if self._bad is None or self._first_bad is None:
            self._bad, self._first_bad = other._bad.clone(), other._first_bad.clone()
            return
        ob, of = other._bad.to(self._bad.device), other._first_bad.to(self._bad.device)
        first = torch.where(self._bad & ob, torch.minimum(self._first_bad, of), torch.where(ob, of, self._first_bad))
        self._bad, self._first_bad = self._bad | ob, first

    def _poisoned(self) -> bool:
        """NaN/Inf was seen (a read-back: for merge and compute, never per batch)."""
        return self._bad is not None and bool(self._bad)

    def _invalid(self, what: str) -> CalibrationError:
        return CalibrationError(f"invalid {type(self).__name__} state: {what}", layer=self.layer)


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


def _tensor(d: dict[str, torch.Tensor], key: str, obs: Observer, dims: int, numel: Optional[int] = None,
            floating: Optional[bool] = None) -> torch.Tensor:
    """``d[key]`` checked: a tensor of ``dims`` dimensions (``numel`` elements), floating
    point or integer as asked."""
    t = d.get(key)
    if not isinstance(t, torch.Tensor):
        raise obs._invalid(f"missing tensor {key!r}")
    if t.dim() != dims or (numel is not None and t.numel() != numel):
        raise obs._invalid(f"{key!r} has shape {tuple(t.shape)}")
    if floating is not None and t.is_floating_point() != floating:
        raise obs._invalid(f"{key!r} has dtype {t.dtype}")
    return t


class IfmrExactObserver(Observer):
    """AMCT's store-everything IFMR: keeps every element (float32) and searches on all of it.
    Memory grows with batch_num; merge = concatenation (A then B)."""

    def __init__(self, layer: str, max_percentile: float = 0.999999, min_percentile: float = 0.999999,
                 search_range=(0.7, 1.3), search_step: float = 0.01, asymmetric: bool = True) -> None:
        super().__init__(layer)
        self.params = _IfmrParams(max_percentile, min_percentile, search_range, search_step, asymmetric)
        self.reset()

    def reset(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self._bad = self._first_bad = None

    def _update(self, xf: torch.Tensor) -> torch.Tensor:
        lo, hi = torch.aminmax(xf)
        self.chunks.append(xf.clone())
        return ~(torch.isfinite(lo) & torch.isfinite(hi))

    def merge(self, other: IfmrExactObserver) -> None:
        self._merge_flags(other)
        self.chunks.extend(other.chunks)

    def data(self) -> torch.Tensor:
        if not self.chunks:
            self._empty()
        if len(self.chunks) > 1:
            self.chunks = [torch.cat(self.chunks)]
        return self.chunks[0]

    def compute(self) -> tuple[float, int]:
        self._raise_if_bad()
        r = ifmr_exact(self.data(), **self.params.kwargs())
        return r.scale, r.offset

    def state_dict(self) -> dict[str, torch.Tensor]:
        self._raise_if_bad()
        return {"data": self.data() if self.chunks else torch.zeros(0)}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        self.reset()
        data = _tensor(d, "data", self, 1, floating=True)
        if data.numel() and not bool(torch.isfinite(data).all()):
            raise self._invalid("'data' holds NaN or Inf")
        self.chunks = [data.float().clone()] if data.numel() else []


class IfmrStreamingObserver(Observer):
    """Memory-bounded IFMR: exact count, extremes and top/bottom-``TOPK`` values, plus a
    power-of-two-grid histogram with per-bin offset sums (algorithms/histogram.py,
    algorithms/streaming.py). Fixed size whatever batch_num is."""

    order_free = True

    def __init__(self, layer: str, max_percentile: float = 0.999999, min_percentile: float = 0.999999,
                 search_range=(0.7, 1.3), search_step: float = 0.01, asymmetric: bool = True,
                 nbins: int = STREAM_BINS, topk: int = TOPK) -> None:
        super().__init__(layer)
        self.params = _IfmrParams(max_percentile, min_percentile, search_range, search_step, asymmetric)
        self.nbins = nbins
        self.topk = topk
        self.reset()

    def reset(self) -> None:
        self.state: Optional[StreamState] = None
        self._bad = self._first_bad = None

    def _update(self, xf: torch.Tensor) -> torch.Tensor:
        if self.state is None:
            self.state = StreamState.empty(self.nbins, self.topk, xf.device)
        return backend_for(xf.device).stream_update(self.state, xf)

    # read-only views for reports and tests (these read back)
    @property
    def count(self) -> int:
        return 0 if self.state is None else int(self.state.count)

    @property
    def top(self) -> Optional[torch.Tensor]:
        return None if self.state is None else self.state.top

    @property
    def bottom(self) -> Optional[torch.Tensor]:
        return None if self.state is None else self.state.bottom

    @property
    def counts(self) -> Optional[torch.Tensor]:
        """Per-bin counts (int64, nbins), overflow folded."""
        if self.state is None:
            return None
        histogram.fold_overflow(self.state.counts, self.state.dsum)
        return self.state.counts[:self.nbins]

    @property
    def dsum(self) -> Optional[torch.Tensor]:
        """Per-bin sums of offsets in bin units (float64, nbins), overflow folded."""
        if self.state is None:
            return None
        histogram.fold_overflow(self.state.counts, self.state.dsum)
        return self.state.dsum[:self.nbins]

    @property
    def frame(self) -> tuple[int, int]:
        if self.state is None:
            return 0, 0
        e, base = self.state.frame.tolist()
        return int(e), int(base)

    def _observed(self) -> tuple[StreamState, torch.Tensor, torch.Tensor]:
        """The state of an observer that has data, with its per-bin counts and offset sums
        (``counts``, ``dsum``)."""
        assert self.state is not None, "no data observed"
        histogram.fold_overflow(self.state.counts, self.state.dsum)
        return self.state, self.state.counts[:self.nbins], self.state.dsum[:self.nbins]

    def merge(self, other: IfmrStreamingObserver) -> None:
        self._merge_flags(other)
        if other.count == 0 or self._poisoned():
            return
        if self.count == 0:
            self.load_state_dict(other.state_dict())
            return
        (st, counts, dsum), (ost, ocounts, odsum) = self._observed(), other._observed()
        dev = st.top.device
        with cpu_threads(dev):
            st.top = torch.topk(torch.cat([st.top, ost.top.to(dev)]), self.topk).values
            st.bottom = torch.topk(torch.cat([st.bottom, ost.bottom.to(dev)]), self.topk,
                                   largest=False).values
            (gmin, gmax), (ogmin, ogmax) = st.range.tolist(), ost.range.tolist()
            gmin, gmax = min(gmin, ogmin), max(gmax, ogmax)
            e_old, base_old = self.frame
            e, base = histogram.frame_for(gmin, gmax, self.nbins, e_old)
            mc, md = histogram.reframe(counts, dsum, e_old, base_old, e, base)
            oc, od = histogram.reframe(ocounts.to(dev), odsum.to(dev), *other.frame, e, base)
            zero = torch.zeros(1, dtype=torch.int64, device=dev)
            st.counts = torch.cat([mc + oc, zero])
            st.dsum = torch.cat([md + od, zero.double()])
            st.frame = torch.tensor([e, base], dtype=torch.int64, device=dev)
            st.range = torch.tensor([gmin, gmax], dtype=torch.float64, device=dev)
            st.count = st.count + other.count

    def compute(self) -> tuple[float, int]:
        self._raise_if_bad()
        if self.count == 0:
            self._empty()
        e, base = self.frame
        st, counts, dsum = self._observed()
        dev = st.counts.device
        ops = backend_for(dev)
        with cpu_threads(dev):
            r = ifmr_from_histogram(self.count, st.top, st.bottom,
                                    histogram.bin_starts(e, base, self.nbins, dev),
                                    math.ldexp(1.0, e), counts, dsum * math.ldexp(1.0, e),
                                    **self.params.kwargs(), losses_fn=ops.ifmr_hist_losses)
        return r.scale, r.offset

    def state_dict(self) -> dict[str, torch.Tensor]:
        self._raise_if_bad()
        if self.count == 0:
            return {"count": torch.zeros((), dtype=torch.int64)}
        st, counts, dsum = self._observed()
        return {"count": st.count.clone(), "top": st.top, "bottom": st.bottom,
                "counts": counts, "dsum": dsum, "frame": st.frame, "range": st.range}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a state, checking every tensor against this observer's sizes and the
        invariants an honest state has (a checkpoint is untrusted input)."""
        self.reset()
        count = int(_tensor(d, "count", self, 0, floating=False))
        if not 0 <= count <= MAX_COUNT:
            raise self._invalid(f"count {count} out of range")
        if count == 0:
            return
        top = _tensor(d, "top", self, 1, self.topk, floating=True).float()
        bottom = _tensor(d, "bottom", self, 1, self.topk, floating=True).float()
        counts = _tensor(d, "counts", self, 1, self.nbins, floating=False).to(torch.int64)
        dsum = _tensor(d, "dsum", self, 1, self.nbins, floating=True).double()
        frame = _tensor(d, "frame", self, 1, 2, floating=False).to(torch.int64)
        rng = _tensor(d, "range", self, 1, 2, floating=True).double()
        dev = counts.device
        e, base = (int(v) for v in frame.tolist())
        gmin, gmax = rng.tolist()
        problems = [
            (not (math.isfinite(gmin) and math.isfinite(gmax) and gmin <= gmax), "range"),
            (not histogram.MIN_EXP <= e <= 1100 or abs(base) > 1 << 60, "frame"),
            (bool((counts < 0).any()) or int(counts.sum()) != count, "counts (negative, or not summing to count)"),
            (not bool(torch.isfinite(dsum).all()) or bool((dsum < 0).any())
             or bool((dsum > counts.double()).any()), "dsum (offsets must lie in [0, count] per bin)"),
            (bool(torch.isnan(top).any()) or bool((top[:-1] < top[1:]).any()), "top (not sorted descending)"),
            (bool(torch.isnan(bottom).any()) or bool((bottom[:-1] > bottom[1:]).any()),
             "bottom (not sorted ascending)"),
        ]
        for bad, what in problems:
            if bad:
                raise self._invalid(what)
        zero = torch.zeros(1, dtype=torch.int64, device=dev)
        self.state = StreamState(count=torch.tensor(count, dtype=torch.int64, device=dev),
                                 top=top.clone().to(dev).contiguous(), bottom=bottom.clone().to(dev).contiguous(),
                                 counts=torch.cat([counts, zero]), dsum=torch.cat([dsum, zero.double()]),
                                 frame=frame.clone().to(dev), range=rng.clone().to(dev))


class HfmgObserver(Observer):
    """HFMG: a ``num_of_bins`` histogram whose range follows the sequential rule.

    ``merge`` of a histogram built on another range redistributes *both* histograms onto the
    union range with the same rule (floor lower share) and adds them; counts are preserved
    exactly, bin positions approximately (docs/algorithms.md measures the deviation)."""

    order_free = True

    def __init__(self, layer: str, num_of_bins: int = 4096, asymmetric: bool = True) -> None:
        super().__init__(layer)
        self.nbins = int(num_of_bins)
        self.asymmetric = bool(asymmetric)
        self.reset()

    def reset(self) -> None:
        self._counts: Optional[torch.Tensor] = None
        self._range: Optional[torch.Tensor] = None     # float64 [2]
        self._seen: Optional[torch.Tensor] = None      # 0-d bool
        self._bad = self._first_bad = None

    def _update(self, xf: torch.Tensor) -> torch.Tensor:
        dev = xf.device
        if self._counts is None or self._range is None or self._seen is None:  # set together
            self._counts = torch.zeros(self.nbins, dtype=torch.int64, device=dev)
            self._range = torch.full((2,), math.inf, dtype=torch.float64, device=dev)
            self._range[1:].fill_(-math.inf)
            self._seen = torch.zeros((), dtype=torch.bool, device=dev)
        counts, rng, bad = backend_for(dev).hfmg_update(self._counts, self._range, self._seen, xf)
        if counts is not self._counts:          # keep the state's storage (CUDA-graph replays)
            self._counts.copy_(counts)
        if rng is not self._range:
            self._range.copy_(rng)
        self._seen.fill_(True)
        return bad

    @property
    def counts(self) -> Optional[torch.Tensor]:
        return self._counts

    @property
    def mn(self) -> float:
        return math.inf if self._range is None else float(self._range[0])

    @property
    def mx(self) -> float:
        return -math.inf if self._range is None else float(self._range[1])

    def merge(self, other: HfmgObserver) -> None:
        self._merge_flags(other)
        if other._counts is None or self._poisoned():
            return
        if self._counts is None:
            self.load_state_dict(other.state_dict())
            return
        mn, mx, omn, omx = self.mn, self.mx, other.mn, other.mx
        nmn, nmx = min(mn, omn), max(mx, omx)
        mine = hfmg.redistribute(self._counts, mn, mx, nmn, nmx)
        theirs = hfmg.redistribute(other._counts.to(self._counts.device), omn, omx, nmn, nmx)
        self._counts = mine + theirs
        self._range = torch.tensor([nmn, nmx], dtype=torch.float64, device=self._counts.device)

    def compute(self) -> tuple[float, int]:
        self._raise_if_bad()
        if self._counts is None:
            self._empty()
        dev = self._counts.device
        with cpu_threads(dev):
            r = hfmg.hfmg_factors(self._counts, self.mn, self.mx, self.asymmetric,
                                  search=backend_for(dev).hfmg_search)
        return r.scale, r.offset

    def state_dict(self) -> dict[str, torch.Tensor]:
        self._raise_if_bad()
        if self._counts is None or self._range is None:  # set together
            return {"counts": torch.zeros(0, dtype=torch.int64)}
        return {"counts": self._counts, "range": self._range}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a state, checking its sizes and values (a checkpoint is untrusted input)."""
        self.reset()
        counts = _tensor(d, "counts", self, 1, floating=False)
        if counts.numel() == 0:
            return
        if counts.numel() != self.nbins:
            raise self._invalid(f"'counts' has {counts.numel()} bins, the config says {self.nbins}")
        rng = _tensor(d, "range", self, 1, 2, floating=True).double()
        mn, mx = rng.tolist()
        if not (math.isfinite(mn) and math.isfinite(mx) and mn <= mx):
            raise self._invalid("range")
        if bool((counts < 0).any()) or int(counts.sum()) > MAX_COUNT:
            raise self._invalid("counts (negative or too large)")
        self._counts = counts.to(torch.int64).clone()
        self._range = rng.clone()
        self._seen = torch.ones((), dtype=torch.bool, device=counts.device)


def make_observer(layer_name: str, cfg, ifmr_mode: str = "streaming") -> Observer:
    """Observer for one quantized input from a per-layer config (attributes act_algo,
    max_percentile, min_percentile, search_range, search_step, num_of_bins, asymmetric);
    ``ifmr_mode`` "streaming" (default, memory-bounded) or "exact" (AMCT's store-everything)."""
    name = getattr(cfg, "act_algo", DEFAULT.name)
    algo = ACT_ALGORITHMS.get(name)
    if algo is None:
        raise CalibrationError(f"unknown activation algorithm {name!r}", layer=layer_name)
    cls = algo.observer_class(ifmr_mode)
    if cls is None:
        raise CalibrationError(f"unknown {algo.title} mode {ifmr_mode!r}", layer=layer_name)
    kw = {f.name: tuple(getattr(cfg, f.name)) if f.kind == "range" else getattr(cfg, f.name)
          for f in algo.fields}
    return globals()[cls](layer_name, asymmetric=cfg.asymmetric, **kw)
