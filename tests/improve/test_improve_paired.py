"""The stage guard's paired statistic (``pipeline.compare``, ``pipeline._keep``) against a plain
numpy computation: per output, each row's error power under the default minus under the
candidate, its mean and standard error; a stage is kept when no output's lower confidence bound
(mean − Z standard errors) is below zero and its worst output's SQNR gains."""
from __future__ import annotations

import math

import numpy as np
import torch

from amct_torch.improve.pipeline import Z, _keep, compare


def powers(signal: np.ndarray, err: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.stack([signal, err]).astype(np.float64))


def reference(signal, e_def, e_cand):
    d = e_def - e_cand
    n = len(d)
    se = d.std(ddof=1) / math.sqrt(n)
    return (10 * math.log10(signal.sum() / e_cand.sum()), 10 * math.log10(e_def.sum() / e_cand.sum()),
            d.mean() - Z * se >= 0)


def test_statistic_matches_numpy_and_the_verdict_follows_the_bound():
    rng = np.random.default_rng(0)
    n = 64
    sig = rng.uniform(50, 100, n)
    e_def = rng.uniform(0.5, 1.5, n)
    cases = {
        "consistent gain": e_def * rng.uniform(0.6, 0.8, n),
        "gain carried by one row": np.concatenate([[0.0], e_def[1:] * 1.02]),
        "no change": e_def.copy(),
    }
    # make the one-row case gain on the total: that row's default error is made large
    e_def2 = e_def.copy()
    e_def2[0] = 20.0
    base = [powers(sig, e_def), powers(sig, e_def2)]
    default = compare("default", base, base)
    assert default.gain_db == [0.0, 0.0] and not _keep(default, default)
    got = {}
    for name, ec in cases.items():
        st = compare(name, base, [powers(sig, ec), powers(sig, ec)])
        for o, e_ref in enumerate([e_def, e_def2]):
            want_sqnr, want_gain, want_ok = reference(sig, e_ref, ec)
            assert abs(st.sqnr_db[o] - want_sqnr) < 1e-9 and abs(st.gain_db[o] - want_gain) < 1e-9
            assert (st.lower_db[o] >= 0) == want_ok
        got[name] = _keep(st, default)
    assert got == {"consistent gain": True, "gain carried by one row": False, "no change": False}


def test_one_output_losing_rejects_the_stage():
    rng = np.random.default_rng(1)
    n = 100
    sig, e = rng.uniform(50, 100, n), rng.uniform(0.5, 1.5, n)
    base = [powers(sig, e), powers(sig * 4, e)]
    default = compare("default", base, base)
    better, slightly_worse = e * 0.5, e * 1.01   # the second output (the better one) loses 0.04 dB
    st = compare("x", base, [powers(sig, better), powers(sig * 4, slightly_worse)])
    assert st.worst_db > default.worst_db and st.lower_db[1] < 0 and not _keep(st, default)
    st = compare("y", base, [powers(sig, better), powers(sig * 4, e * 0.9)])
    assert _keep(st, default)
    # the standard error in dB: the delta method on the mean error powers
    d = e - better
    want = 10 / math.log(10) * d.std(ddof=1) / math.sqrt(n) / better.mean()
    assert abs(st.error_db[0] - want) < 1e-9
