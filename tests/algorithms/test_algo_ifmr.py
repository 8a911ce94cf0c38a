"""IFMR exact search vs a plain numpy reference written from docs/algorithms.md ("IFMR"), and its sanity
values."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from amct_torch.algorithms.ifmr import (
    boundary_losses,
    candidate_grid,
    candidate_ratios,
    exact_losses,
    ifmr_exact,
    level_thresholds,
    num_candidates,
)

F = np.float32


def ref_ifmr(x, maxp=0.999999, minp=0.999999, start=0.7, end=1.3, step=0.01, asym=True, with_losses=False):
    """Straight from the IFMR definition: sort, k-th order statistics, a loop over candidates."""
    x = np.asarray(x, np.float32).ravel()
    L = x.size
    def kk(p):
        return 1 if abs(p - 1) < 1.1920929e-07 else L - math.floor(p * L)
    srt = np.sort(x)
    max_init = max(F(0), srt[L - kk(maxp)])
    min_init = min(F(0), srt[kk(minp) - 1])
    n = int((F(end) - F(start)) / F(step) + F(1))
    best, best_loss, best_s = None, None, None
    losses = []
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
        losses.append(loss)
        if best_loss is None or loss < best_loss:
            best, best_loss, best_s = i, loss, s
    offset = int(-np.round(min_init / best_s) - 128) if asym else 0
    if with_losses:
        return best, float(best_s), offset, np.array(losses)
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


def test_level_edges_are_exact(device):
    """Each edge T of level j is the first float32 whose level (round(clip(v)/s), float32)
    exceeds j: checked on T and the float just below it, in numpy."""
    rng = np.random.default_rng(11)
    for trial in range(6):
        mx = F(rng.uniform(1e-3, 50)); mn = F(-rng.uniform(0, 50)) if trial % 2 else F(0)
        ratios = candidate_ratios(0.7, 1.3, 0.01, device)
        lo, hi, s = candidate_grid(torch.tensor(mx, device=device), torch.tensor(mn, device=device),
                                   ratios, bool(trial % 3))
        level, thr, valid, ok = level_thresholds(lo, hi, s)
        assert bool(ok)
        lo_, hi_, s_ = (t.cpu().numpy() for t in (lo, hi, s))
        for i in range(0, ratios.numel(), 7):
            v = valid[i].cpu().numpy()
            t = thr[i].cpu().numpy()[v]
            j = level[i].cpu().numpy()[v]
            below = np.nextafter(t, F(-np.inf))
            lv = lambda u, lo=lo_[i], hi=hi_[i], s=s_[i]: np.round(np.clip(u, lo, hi) / s)
            assert np.all(lv(t) > j) and np.all(lv(below) <= j)
            assert v.sum() == int(np.round(hi_[i] / s_[i]) - np.round(lo_[i] / s_[i]))


@pytest.mark.parametrize("kind", ["normal", "relu", "heavy", "negative"])
def test_losses_match_reference_per_candidate(kind, device):
    """Every candidate's loss (not only the winner) equals the plain float32 definition."""
    rng = np.random.default_rng(len(kind))
    x = _sample(rng, kind, 20000).astype(np.float32)
    for asym in (True, False):
        ri, rs, ro, ref = ref_ifmr(x, asym=asym, with_losses=True)
        r = ifmr_exact(torch.from_numpy(x).to(device), asymmetric=asym)
        assert r.index == ri and r.offset == ro
        np.testing.assert_allclose(r.losses.cpu().numpy(), ref, rtol=1e-9)


@pytest.mark.parametrize("kind", ["normal", "relu"])
def test_elementwise_pass_with_zeros_matches_reference(kind, device):
    """The element-wise pass ``ifmr_exact`` uses on accelerators (no host sync, zeros kept in
    the data: their error is 0 for every candidate) gives every candidate's reference loss
    (squares summed in float32 within a block, hence 1e-5) and the reference's choice."""
    rng = np.random.default_rng(7)
    x = _sample(rng, kind, 20000).astype(np.float32)
    x[::5] = 0.0
    for asym in (True, False):
        best, _, _, ref = ref_ifmr(x, asym=asym, with_losses=True)
        r = ifmr_exact(torch.from_numpy(x).to(device), asymmetric=asym)
        ratios = candidate_ratios(0.7, 1.3, 0.01, device)
        lo, hi, s = candidate_grid(torch.tensor(r.max_init, device=device), torch.tensor(r.min_init, device=device),
                                   ratios, asym)
        got = exact_losses(torch.from_numpy(x).to(device), lo, hi, s)
        np.testing.assert_allclose(got.cpu().numpy(), ref, rtol=1e-5)
        assert int(torch.argmin(got)) == best


def test_duplicates_on_level_edges(device):
    """Data piled on the rounding edges themselves (exact midpoints (j+½)·s of several
    candidates and their float32 neighbours, many copies each) and few bins: the edge bins are
    large and full of ties; choice and losses still match the reference."""
    base = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    base[0] = F(4.0)  # max_init with p = 1.0
    pieces = [base]
    for ratio_i in (10, 14, 30):
        ratio = F(0.7) + F(ratio_i) * F(0.01)
        s = F(F(ratio * F(4.0)) / F(127))
        for j in (-60, -3, 0, 2, 17, 90):
            mid = F((j + 0.5) * np.float64(s))
            for u in (np.nextafter(mid, F(-9)), mid, np.nextafter(mid, F(9))):
                pieces.append(np.full(50, u, np.float32))
    x = np.concatenate(pieces)
    ri, rs, ro, ref = ref_ifmr(x, 1.0, 1.0, asym=False, with_losses=True)
    xt = torch.from_numpy(x).to(device)
    r = ifmr_exact(xt, 1.0, 1.0, asymmetric=False)
    assert (r.index, r.offset) == (ri, ro) and r.scale == pytest.approx(rs, rel=1e-6)
    np.testing.assert_allclose(r.losses.cpu().numpy(), ref, rtol=1e-9)
    lo, hi, s = candidate_grid(torch.tensor(F(4.0), device=device), torch.tensor(x.min(), device=device),
                               candidate_ratios(0.7, 1.3, 0.01, device), False)
    for bins in (1, 16, 1 << 16):
        losses, ok = boundary_losses(xt, lo, hi, s, bins=bins)
        assert bool(ok)
        np.testing.assert_allclose(losses.cpu().numpy(), ref, rtol=1e-9)
