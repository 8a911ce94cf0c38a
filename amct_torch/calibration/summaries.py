"""A small picture of each observer's statistics, taken when the factors are computed: a
histogram of the layer's input over the calibration data, its extremes, and how many values
fall outside the chosen int8 grid.

Why from the observers: they already hold what the report needs (streaming IFMR: exact
extremes, top/bottom values and a fine power-of-two histogram with per-bin mean offsets;
HFMG: its histogram over [min, max]; exact IFMR: every value), so no second pass over the
data is made. The session frees the observers after computing the factors; this keeps only
``BINS`` counts per group (a few KB for a whole model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from amct_torch.algorithms.quant import QMAX, QMIN

#: display bins of a summary's histogram
BINS = 64


@dataclass
class ActivationSummary:
    """One calibrated input: ``algo`` (``ifmr``, ``ifmr-exact``, ``hfmg``), ``count`` values
    seen, ``lo``/``hi`` their extremes, ``counts[i]`` values in ``[edges[i], edges[i + 1])``,
    the factors the observer chose (``scale``, ``offset``) and the values beyond the grid's
    half-step edges below (``clipped_low``) and above (``clipped_high``)."""

    algo: str
    count: int
    lo: float
    hi: float
    edges: list[float]
    counts: list[int]
    scale: float
    offset: int
    clipped_low: int
    clipped_high: int

    @property
    def clip(self) -> tuple[float, float]:
        """The grid's range: the values of codes -128 and 127."""
        return clip_range(self.scale, self.offset)

    @property
    def clipped_share(self) -> float:
        return (self.clipped_low + self.clipped_high) / self.count if self.count else 0.0


def clip_range(scale: float, offset: int) -> tuple[float, float]:
    """The values the codes ``QMIN`` and ``QMAX`` stand for (``(q - offset) * scale``)."""
    return (QMIN - offset) * scale, (QMAX - offset) * scale


def _saturating(scale: float, offset: int) -> tuple[float, float]:
    """Values below / above these round to a code outside [QMIN, QMAX]: they are clipped."""
    return (QMIN - 0.5 - offset) * scale, (QMAX + 0.5 - offset) * scale


def _display(positions: np.ndarray, weights: np.ndarray, lo: float, hi: float) -> tuple[list, list]:
    """Weighted values rebinned onto ``BINS`` equal bins over [lo, hi]."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0) * 1e-6
    counts, edges = np.histogram(np.clip(positions, lo, hi), bins=BINS, range=(lo, hi), weights=weights)
    return edges.tolist(), np.rint(counts).astype(np.int64).tolist()


def _from_fine(positions: np.ndarray, weights: np.ndarray, edge_lo: float, edge_hi: float) -> tuple[int, int]:
    """Values beyond the clip edges, counted from a fine histogram's bin positions."""
    return int(weights[positions < edge_lo].sum()), int(weights[positions > edge_hi].sum())


def summarize(obs: Any, scale: float, offset: int) -> Optional[ActivationSummary]:
    """The summary of an observer whose factors are ``scale``/``offset`` (after ``compute``);
    None for a stand-in without statistics (a group another process folded under torchrun)."""
    from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver

    edge_lo, edge_hi = _saturating(scale, offset)
    if isinstance(obs, IfmrExactObserver):
        data = obs.data().detach().cpu().numpy().astype(np.float64)
        lo, hi = float(data.min()), float(data.max())
        edges, counts = _display(data, np.ones_like(data), lo, hi)
        low, high = int((data < edge_lo).sum()), int((data > edge_hi).sum())
        return ActivationSummary("ifmr-exact", data.size, lo, hi, edges, counts, scale, offset, low, high)
    if isinstance(obs, IfmrStreamingObserver):
        st, fine, dsum = obs.state, obs.counts, obs.dsum
        assert st is not None and fine is not None and dsum is not None  # compute() succeeded
        e, base = obs.frame
        width = math.ldexp(1.0, e)
        w = fine.cpu().numpy().astype(np.float64)
        filled = np.flatnonzero(w)
        w = w[filled]
        # each bin's values sit at its start plus their mean offset (the observer's dsum)
        pos = (filled + base + dsum.cpu().numpy()[filled] / w) * width
        lo, hi = st.range.cpu().tolist()
        top, bottom = st.top.cpu().numpy(), st.bottom.cpu().numpy()
        low, high = _from_fine(pos, w, edge_lo, edge_hi)
        # exact where the kept extremes reach past the edge (fewer beyond it than kept)
        n_top, n_bottom = int((top > edge_hi).sum()), int((bottom < edge_lo).sum())
        if n_top < top.size:
            high = n_top
        if n_bottom < bottom.size:
            low = n_bottom
        edges, counts = _display(pos, w, lo, hi)
        return ActivationSummary("ifmr", obs.count, lo, hi, edges, counts, scale, offset, low, high)
    if isinstance(obs, HfmgObserver):
        from amct_torch.algorithms.hfmg import bin_width
        assert obs.counts is not None  # compute() succeeded
        hw = obs.counts.cpu().numpy().astype(np.float64)
        lo, hi = obs.mn, obs.mx
        centres = lo + (np.arange(hw.size) + 0.5) * bin_width(lo, hi, hw.size)
        low, high = _from_fine(centres, hw, edge_lo, edge_hi)
        edges, counts = _display(centres, hw, lo, hi)
        return ActivationSummary("hfmg", int(hw.sum()), lo, hi, edges, counts, scale, offset, low, high)
    return None
