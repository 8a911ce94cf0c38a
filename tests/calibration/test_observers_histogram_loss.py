"""The streaming IFMR loss (prefix sums read at rounding boundaries) against a plain per-bin
loop written from its definition, including bins wider than a quantization level; and the
observers' results do not depend on the intra-op thread count they run with."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from amct_torch.algorithms.ifmr import candidate_grid, candidate_ratios, histogram_losses
from amct_torch.calibration import backends
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver


def ref_losses(start, width, counts, dsum, lo, hi, s):
    """Σ over quantization levels of q²·N − 2·q·S (the loss up to Σx²): each bin is cut at the
    rounding boundaries inside it; every piece below a boundary takes the uniform share of the
    bin's count and the first moment of a uniform piece, the piece above the bin's last
    boundary takes what is left of the count and of the bin's first moment n·a + D."""
    out = []
    for lo_i, hi_i, s_i in zip(lo, hi, s):
        m_lo, m_hi = round(lo_i / s_i), round(hi_i / s_i)   # float64, half-even like torch
        bounds = [(m_lo + j + 0.5) * s_i for j in range(int(m_hi - m_lo))]
        total = 0.0
        for b, (n, d) in enumerate(zip(counts, dsum)):
            if n == 0:
                continue
            a = start + b * width
            inside = [t for t in bounds if a < t < a + width]
            level = m_lo + sum(t <= a for t in bounds)       # level of the bin's first piece
            f_prev, n_left, s_left = 0.0, float(n), n * a + d
            for t in inside:
                f = (t - a) / width
                n_p = n * (f - f_prev)
                s_p = n_p * (a + width * (f + f_prev) / 2)
                q = level * s_i
                total += q * q * n_p - 2 * q * s_p
                n_left -= n_p
                s_left -= s_p
                f_prev, level = f, level + 1
            q = level * s_i
            total += q * q * n_left - 2 * q * s_left
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize("asym", [True, False])
@pytest.mark.parametrize("nbins,levels_per_bin", [(64, 0.05), (40, 3.0)])
def test_histogram_losses_match_per_bin_reference(asym, nbins, levels_per_bin, device):
    rng = np.random.default_rng(nbins + asym)
    counts = rng.integers(0, 50, nbins) * (rng.random(nbins) < 0.8)
    dsum = counts * rng.random(nbins)                       # offsets in [0, 1) bin widths
    mx, mn = 2.0, -0.7
    width = (mx - mn) * levels_per_bin / 255 if levels_per_bin > 1 else (mx - mn) / nbins
    start = mn - 3 * width if levels_per_bin > 1 else mn
    ratios = candidate_ratios(0.7, 1.3, 0.01)
    lo, hi, s = candidate_grid(torch.tensor(mx), torch.tensor(mn), ratios, asym)
    bin_lo = start + torch.arange(nbins, dtype=torch.float64) * width
    got = histogram_losses(bin_lo.to(device), width, torch.from_numpy(counts).to(device),
                           torch.from_numpy(dsum * width).to(device), lo.to(device), hi.to(device),
                           s.to(device)).cpu().numpy()
    ref = ref_losses(start, width, counts, dsum * width, lo.double().tolist(), hi.double().tolist(),
                     s.double().tolist())
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got / scale, ref / scale, rtol=0, atol=1e-9)


@pytest.mark.parametrize("cls", [IfmrStreamingObserver, IfmrExactObserver, HfmgObserver])
def test_results_do_not_depend_on_thread_count(cls, monkeypatch):
    if torch.get_num_threads() < 2:
        torch.set_num_threads(2)
    g = torch.Generator().manual_seed(7)
    data = [torch.relu(torch.randn(300_000, generator=g) + 0.2) * 3 for _ in range(3)]
    results = []
    for threads in (None, 1):
        monkeypatch.setattr(backends, "CPU_THREADS", threads)
        before = torch.get_num_threads()
        o = cls("l")
        for x in data:
            o.update(x)
        results.append(o.compute())
        assert torch.get_num_threads() == before      # restored after every call
    assert results[0] == results[1]
    assert all(math.isfinite(v) for v in results[0])
