"""HFMG vs a plain loop reference written from docs/algorithms.md, "HFMG" (histogram, sequential merge, walk,
analytic loss, factors)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from amct_torch.algorithms import hfmg
from amct_torch.calibration.observers import HfmgObserver
from helpers.hfmg_reference import ref_hist, ref_redistribute

F = np.float32


def ref_walk(counts):
    nbins = counts.size
    total = int(counts.sum())
    step = max(math.ceil(total / 100000), 1)
    min_bins = math.ceil(nbins / 4)
    left, right = 0, nbins - 1
    cands = []
    while right - left > min_bins:
        tl, acc = left, 0
        while acc < step and tl < right:
            acc += counts[tl]; tl += 1
        tr, acc = right, 0
        while acc < step and tr > tl:
            acc += counts[tr]; tr -= 1
        if right - tr >= tl - left:
            right = tr
        else:
            left = tl
        cands.append((left, right))
    return cands


def ref_loss(counts, bw, l, r):
    dw = bw * (r - l + 1) / 256
    if dw < 1.1920929e-07:
        return 0.0
    total = 0.0
    dens = counts / bw
    for j in np.nonzero(counts)[0]:
        b = (j - l) * bw; e = b + bw
        bi = min(255, max(0, math.floor(b / dw))); ei = min(255, max(0, math.floor(e / dw)))
        if bi == ei:
            cb = (bi + 0.5) * dw
            total += dens[j] * ((e - cb) ** 3 - (b - cb) ** 3) / 3
        else:
            cb = (bi + 0.5) * dw; ce = (ei + 0.5) * dw
            total += dens[j] * (((dw / 2) ** 3 - (b - cb) ** 3) / 3 + (ei - bi - 1) * (dw ** 3) / 12
                                + ((e - ce) ** 3 + (dw / 2) ** 3) / 3)
    return total


def ref_hfmg(batches, nbins, asym):
    mn = mx = None
    counts = None
    for x in batches:
        lo, hi = float(x.min()), float(x.max())
        if counts is None:
            mn, mx, counts = lo, hi, ref_hist(x, lo, hi, nbins)
            continue
        nmn, nmx = min(mn, lo), max(mx, hi)
        if (nmn, nmx) != (mn, mx):
            counts = ref_redistribute(counts, mn, mx, nmn, nmx)
        mn, mx = nmn, nmx
        counts = counts + ref_hist(x, mn, mx, nbins)
    bw = float(F((mx - mn) / nbins))
    cands = ref_walk(counts)
    losses = [ref_loss(counts, bw, l, r) for l, r in cands]
    best = int(np.argmin(losses))
    l, r = cands[best]
    cmin, cmax = float(F(mn + l * bw)), float(F(mn + (r + 1) * bw))
    if asym:
        cmax, cmin = max(cmax, 0.0), min(cmin, 0.0)
        s = float(F((cmax - cmin) / 255)) or 1.0
        return counts, cands, losses, best, s, -128 - int(np.round(F(cmin / s)))
    s = float(F(cmax / 127)) if cmax > -cmin else float(F(-cmin / 128))
    return counts, cands, losses, best, s, 0


def _batches(rng, kind, nb):
    out = []
    for _ in range(nb):
        n = int(rng.integers(50, 20000))
        if kind == "normal":
            x = rng.standard_normal(n) * rng.uniform(0.5, 2) + rng.uniform(-0.5, 0.5)
        elif kind == "relu":
            x = np.maximum(rng.standard_normal(n), 0)
        elif kind == "heavy":
            x = rng.standard_t(2, n)
        elif kind == "bimodal":
            x = np.concatenate([rng.normal(-3, 0.1, n // 2), rng.normal(4, 0.1, n - n // 2)])
        else:
            x = np.full(n, 1.5)
        out.append(x.astype(np.float32))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["normal", "relu", "heavy", "bimodal", "constant"])
def test_observer_matches_reference(kind, device, cpu_backend):
    rng = np.random.default_rng(len(kind))
    for trial in range(2):
        nbins = [1024, 2048][trial]
        asym = trial == 0
        batches = _batches(rng, kind, 3)
        counts, cands, losses, best, s, o = ref_hfmg(batches, nbins, asym)
        obs = HfmgObserver("layer", num_of_bins=nbins, asymmetric=asym)
        for x in batches:
            obs.update(torch.from_numpy(x).to(device))
        assert np.array_equal(obs.counts.cpu().numpy(), counts)
        lefts, rights = hfmg.candidates(obs.counts)
        assert list(zip(lefts.tolist(), rights.tolist())) == cands
        res = hfmg.hfmg_factors(obs.counts, obs.mn, obs.mx, asym)
        np.testing.assert_allclose(res.losses.cpu().numpy(), losses, rtol=1e-9, atol=1e-12)
        assert (res.left, res.right) == cands[best]
        assert res.offset == o
        assert res.scale == pytest.approx(s, rel=1e-6)
        assert obs.compute() == (res.scale, res.offset)


def test_redistribute_matches_reference(device):
    rng = np.random.default_rng(3)
    for _ in range(5):
        counts = rng.integers(0, 50, 1024)
        omn, omx = sorted(rng.uniform(-2, 2, 2))
        nmn, nmx = omn - rng.uniform(0, 3), omx + rng.uniform(0, 3)
        got = hfmg.redistribute(torch.from_numpy(counts).to(device), omn, omx, nmn, nmx)
        assert np.array_equal(got.cpu().numpy(), ref_redistribute(counts, omn, omx, nmn, nmx))
        assert int(got.sum()) == counts.sum()


def _sparse_counts(rng, kind, n):
    if kind == 0:
        return rng.integers(0, 50, n)
    c = np.zeros(n, np.int64)
    if kind == 1:   # a few spikes: the walks jump over empty stretches and meet (the clamps)
        c[rng.integers(0, n, rng.integers(1, 4))] = rng.integers(1, 10 ** 6)
    elif kind == 2:  # scattered heavy bins
        c = (rng.random(n) < 0.05) * rng.integers(1, 10 ** 7, n)
    elif kind == 3:  # one bin
        c[n // 2] = rng.integers(1, 10 ** 7)
    else:            # sparse light bins (mass per bin below the step)
        c = (rng.random(n) < 0.01) * rng.integers(1, 300000, n)
    c = np.asarray(c, np.int64)
    if c.sum() == 0:
        c[0] = 1
    return c


def _search(counts: torch.Tensor, width: float):
    """The device backend's HFMG walk and losses (the compiled ones on a CPU backend that has
    them, else the tensor formulas)."""
    from amct_torch.calibration.backends import backend_for
    accel = backend_for(counts.device).hfmg_search
    if accel is not None:
        return accel(counts, width)
    lefts, rights = hfmg.candidates(counts)
    return lefts, rights, hfmg.losses(counts, width, lefts, rights)


@pytest.mark.slow
def test_walk_and_losses_on_sparse_histograms(device, cpu_backend):
    """The walk (tensor: chains, merge, end game; or compiled) and the prefix-sum loss
    against the plain loops on histograms where the two walks meet early."""
    rng = np.random.default_rng(11)
    for t in range(250):
        n = int(rng.choice([8, 13, 64, 1024]))
        c = _sparse_counts(rng, t % 5, n)
        lefts, rights, got = _search(torch.from_numpy(c).to(device), 0.37)
        cands = ref_walk(c)
        assert list(zip(lefts.tolist(), rights.tolist())) == cands, (t, n)
        if t % 10 == 0:
            np.testing.assert_allclose(got.cpu().numpy(), [ref_loss(c, 0.37, a, b) for a, b in cands], rtol=1e-9)


def test_float32_rounding_matches_torch():
    """hfmg's bin width and factors round to float32 without tensors (quant.to_float32):
    the same values as torch's conversion, over magnitudes from subnormal to overflow."""
    from amct_torch.algorithms.quant import to_float32
    rng = np.random.default_rng(9)
    vals = rng.uniform(-1, 1, 20000) * 10.0 ** rng.integers(-46, 40, 20000)
    vals = list(vals) + [3.4028235677973366e38, 3.4028236e38, -1e39, 2.0 ** -150, 1.5 * 2.0 ** -149, -0.0]
    for v in vals:
        want = float(torch.tensor(float(v), dtype=torch.float32))
        got = to_float32(float(v))
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), v
