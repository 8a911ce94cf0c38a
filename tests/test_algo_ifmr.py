"""IFMR exact search vs a plain numpy reference written from SPEC §5.2, and SPEC's sanity values."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from amct_torch.algorithms.ifmr import ifmr_exact, num_candidates

F = np.float32


def ref_ifmr(x, maxp=0.999999, minp=0.999999, start=0.7, end=1.3, step=0.01, asym=True):
    """Straight from SPEC §5.2: sort, k-th order statistics, a loop over candidates."""
    x = np.asarray(x, np.float32).ravel()
    L = x.size
    def kk(p):
        return 1 if abs(p - 1) < 1.1920929e-07 else L - math.floor(p * L)
    srt = np.sort(x)
    max_init = max(F(0), srt[L - kk(maxp)])
    min_init = min(F(0), srt[kk(minp) - 1])
    n = int((F(end) - F(start)) / F(step) + F(1))
    best, best_loss, best_s = None, None, None
    for i in range(n):
        ratio = F(start) + F(i) * F(step)
        if asym:
            c = F(ratio * max_init); s = F((c - min_init) / F(255)); lo = min_init
        else:
            pos = max_init > -min_init
            a = max_init if pos else -min_init
            c = F(ratio * a); s = F(c / F(127 if pos else 128)); lo = -c
        if s < 1.1920929e-07:
            s = F(1.0)
        err = np.round(np.clip(x, lo, c) / s) * s - x
        loss = float(np.sum(err.astype(np.float64) ** 2))
        if best_loss is None or loss < best_loss:
            best, best_loss, best_s = i, loss, s
    offset = int(-np.round(min_init / best_s) - 128) if asym else 0
    return best, float(best_s), offset


def _sample(rng, kind, n):
    if kind == "normal":
        return rng.standard_normal(n) * rng.uniform(0.01, 10)
    if kind == "relu":
        return np.maximum(rng.standard_normal(n), 0) * rng.uniform(0.1, 5)
    if kind == "heavy":
        return rng.standard_t(2.5, n)
    if kind == "uniform":
        return rng.uniform(-rng.uniform(0, 3), rng.uniform(0.1, 3), n)
    if kind == "lognormal":
        return rng.lognormal(0, 1, n) - 0.5
    if kind == "tiny":
        return rng.standard_normal(n) * 1e-6 + 3e-6
    if kind == "negative":
        return -np.abs(rng.standard_normal(n))
    return np.full(n, rng.uniform(-2, 2))


KINDS = ["normal", "relu", "heavy", "uniform", "lognormal", "tiny", "negative", "constant"]


@pytest.mark.parametrize("kind", KINDS)
def test_exact_matches_reference(kind, device):
    rng = np.random.default_rng(abs(hash(kind)) % 1000)
    for trial in range(4):
        n = int(rng.integers(1, 30000))
        x = _sample(rng, kind, n).astype(np.float32)
        asym = bool(trial % 2)
        maxp = [0.999999, 0.999, 1.0, 0.9][trial]
        minp = [0.999999, 0.99, 0.999999, 1.0][trial]
        start, end, step = [(0.7, 1.3, 0.01), (0.5, 1.5, 0.05), (0.9, 1.1, 0.002), (0.7, 1.3, 0.01)][trial]
        ri, rs, ro = ref_ifmr(x, maxp, minp, start, end, step, asym)
        r = ifmr_exact(torch.from_numpy(x).to(device), maxp, minp, (start, end), step, asym)
        assert r.index == ri, (kind, trial)
        assert r.offset == ro
        assert r.scale == pytest.approx(rs, rel=1e-6)


def test_large_k_uses_selection(device):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(600000).astype(np.float32)
    ri, rs, ro = ref_ifmr(x, 0.99, 0.99)
    r = ifmr_exact(torch.from_numpy(x).to(device), 0.99, 0.99)
    assert (r.index, r.offset) == (ri, ro) and r.scale == pytest.approx(rs, rel=1e-6)


def test_candidate_count():
    assert num_candidates(0.7, 1.3, 0.01) == 60
    assert num_candidates(0.5, 1.5, 0.5) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_spec_sanity_values(device, dtype):
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(100000).astype(np.float32))
    x = x.to(dtype).float().to(device) if dtype != torch.float32 else x.to(device)
    a = ifmr_exact(x)
    s = ifmr_exact(x, asymmetric=False)
    r = ifmr_exact(torch.relu(x))
    tol = 1e-3 if dtype == torch.float32 else 3e-3
    assert round(a.ratio, 2) == 0.84 and a.offset == 7 and a.scale == pytest.approx(0.03321, rel=tol)
    assert round(s.ratio, 2) == 0.82 and s.offset == 0 and s.scale == pytest.approx(0.03055, rel=tol)
    assert round(r.ratio, 2) == 0.94 and r.offset == -128 and r.scale == pytest.approx(0.01744, rel=tol)
