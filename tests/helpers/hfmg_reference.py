"""Plain-loop references of HFMG's histogram and re-binning, written from docs/algorithms.md
("HFMG"); shared by the formula tests and the compiled-kernel tests."""
from __future__ import annotations

import math

import numpy as np

F = np.float32


def ref_hist(x, mn, mx, nbins):
    out = np.zeros(nbins, np.int64)
    if mx == mn:
        out[nbins // 2] = x.size
        return out
    w = F((mx - mn) / nbins)
    idx = np.floor((x - F(mn)) / w).astype(np.int64)
    np.add.at(out, np.minimum(idx, nbins - 1), 1)
    return out


def ref_redistribute(counts, omn, omx, nmn, nmx):
    nbins = counts.size
    out = np.zeros(nbins, np.int64)
    nw = (nmx - nmn) / nbins
    if omn == omx:
        out[min(nbins - 1, max(0, math.floor((omn - nmn) / nw)))] += counts.sum()
        return out
    ow = (omx - omn) / nbins
    for j in range(nbins):
        lo = omn + j * ow
        hi = lo + ow
        a = min(nbins - 1, max(0, math.floor((lo - nmn) / nw)))
        edge = nmn + (a + 1) * nw
        if hi > edge and a < nbins - 1:
            low = math.floor(min(1.0, max(0.0, (edge - lo) / ow)) * counts[j])
            out[a] += low
            out[a + 1] += counts[j] - low
        else:
            out[a] += counts[j]
    return out
