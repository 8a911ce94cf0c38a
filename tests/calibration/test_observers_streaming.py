"""Streaming IFMR against exact IFMR (the bar streaming must meet: same ratio in ≥ 95 % of cases,
never more than one step away, quantization MSE within 1 %)."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.algorithms.quant import fake_quant
from amct_torch.calibration.observers import IfmrExactObserver, IfmrStreamingObserver


def _gen(rng, kind, n):
    if kind == "normal":
        return rng.standard_normal(n) * rng.uniform(0.1, 3)
    if kind == "relu":
        return np.maximum(rng.standard_normal(n) + rng.uniform(-1, 1), 0)
    if kind == "heavy":
        return rng.standard_t(3, n)
    if kind == "constant":
        return np.full(n, 0.75)
    return rng.standard_normal(n) * 1e-5 + 2e-5   # tiny range


def test_streaming_agrees_with_exact(device):
    rng = np.random.default_rng(0)
    same = total = 0
    for kind in ["normal", "relu", "heavy", "constant", "tiny"]:
        for trial in range(6):
            asym = trial % 2 == 0
            e, s = IfmrExactObserver("l", asymmetric=asym), IfmrStreamingObserver("l", asymmetric=asym)
            data = []
            for _ in range(3):
                x = torch.from_numpy(_gen(rng, kind, int(rng.integers(1000, 40000))).astype(np.float32)).to(device)
                e.update(x); s.update(x); data.append(x)
            (se, oe), (ss, os_) = e.compute(), s.compute()
            # the chosen candidate, read back from the scale
            flat = torch.cat(data)
            mse_e = float(((fake_quant(flat, se, oe) - flat) ** 2).mean())
            mse_s = float(((fake_quant(flat, ss, os_) - flat) ** 2).mean())
            total += 1
            same += (se, oe) == (ss, os_)
            assert abs(ss - se) <= 0.0101 * se / 0.7 + 1e-12, (kind, trial)  # at most one step of ratio
            assert mse_s <= mse_e * 1.01 + 1e-20, (kind, trial, mse_s, mse_e)
    assert same / total >= 0.95
