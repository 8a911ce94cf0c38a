"""The cross-fitted stage guard (``improve/folds.py``, ``pipeline._better``): on a net whose
outputs have few positions, the stages are judged on both folds of the calibration rows (each
row scored by a model not fitted on it); the model kept is never worse than AMCT's default on
its own held-out rows, and a large-output or large-input net keeps the single split."""
from __future__ import annotations

import math

import numpy as np
import torch

import amct_torch
from amct_torch.improve import folds
from amct_torch.improve.pipeline import MARGIN_DB, Stage, _better
from helpers.caffe_nets import rand
from helpers.improve_nets import conv_fc_net


def test_other_fold_swaps_the_roles_only_when_starved_and_small():
    x = torch.arange(32 * 3 * 4 * 4, dtype=torch.float32).reshape(32, 3, 4, 4)
    one_position = [torch.zeros(16, 4)]          # 16 held-out values per channel
    data, n_fit = folds.other_fold((x,), 16, one_position, 32, 64)
    assert n_fit == 16
    assert torch.equal(data[0], torch.cat([x[16:], x[:16]]))   # fit on the held-out rows and back
    # an uneven split (a single batch's last quarter held out): the roles swap all the same
    data, n_fit = folds.other_fold((x,), 24, [torch.zeros(8, 4)], 32, 64)
    assert n_fit == 8 and torch.equal(data[0], torch.cat([x[24:], x[:24]]))
    # an output with 16 x 4 x 4 = 256 held-out values per channel: enough, the single split
    assert folds.other_fold((x,), 16, [torch.zeros(16, 4, 4, 4)], 32, 64) is None
    assert folds.values_per_channel([torch.zeros(16, 4, 4, 4), torch.zeros(16, 2)]) == 16
    # a large input (above MAX_INPUT values per sample): the refining pass would run twice, not here
    big = torch.zeros(4, 3, 128, 128)
    assert 3 * 128 * 128 > folds.MAX_INPUT
    assert folds.other_fold((big,), 2, [torch.zeros(2, 4)], 32, 64) is None


def stage(total, fold1, fold2, per_fold=True):
    st = Stage("s", list(total), halves=[list(fold1), list(fold2)])
    st.per_fold = per_fold
    return st


def test_guard_with_one_model_per_fold():
    default = stage([20.0, 30.0], [19.0, 29.0], [21.0, 31.0], per_fold=False)
    m = MARGIN_DB
    # fold 1's model loses an output on its own rows, fold 2's does not: fold 2's may be kept
    st = stage([20.0 + m, 30.5], [18.9, 29.5], [21.5, 31.2])
    assert _better(st, default) and st.fold == 1
    # both folds' models fine on their own rows: fold 1's (the single split's model) is kept
    st = stage([20.0 + m, 30.5], [19.5, 29.5], [21.5, 31.2])
    assert _better(st, default) and st.fold == 0
    # each fold's model loses an output on its own rows: rejected though the totals gain
    assert not _better(stage([21.0, 31.0], [18.9, 29.5], [21.5, 30.9]), default)
    # an output below the default on all held-out rows, or a worst-output gain under the margin
    assert not _better(stage([21.0, 29.9], [19.5, 29.5], [21.5, 31.2]), default)
    assert not _better(stage([20.0 + m / 2, 30.5], [19.5, 29.5], [21.5, 31.2]), default)
    # one model for both folds (equalization): both folds are its held-out rows, both must hold
    assert not _better(stage([21.0, 31.0], [18.9, 29.5], [21.5, 31.2], per_fold=False), default)
    assert _better(stage([21.0, 31.0], [19.5, 29.5], [21.5, 31.2], per_fold=False), default)


def sqnr(ref: np.ndarray, q: np.ndarray) -> float:
    ref, q = ref.astype(np.float64), q.astype(np.float64)
    return 10 * math.log10((ref ** 2).sum() / ((q - ref) ** 2).sum())


def test_job_judges_on_every_calibration_row_and_keeps_a_model_not_worse_on_its_own(tmp_path, monkeypatch):
    from amct_torch.improve import refine as refine_mod
    calls = []
    real = refine_mod.refine

    def spy(*a, **kw):   # each fold's pass, with the range candidates it was given
        calls.append((int(a[3]), kw.get("multipliers")))
        return real(*a, **kw)
    monkeypatch.setattr(refine_mod, "refine", spy)
    proto, weights = conv_fc_net(tmp_path, convs=1, size=8)
    x = rand(32, 3, 8, 8, seed=7) + 0.5
    kw = dict(batch_num=2, batch_size=16, save_type=None, report=False, quiet=True, device="cpu")
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), **kw)
    res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "b" / "m"), improve="bias_correction", **kw)
    imp = res.improvement
    assert imp["cross_fitted"] is True          # one position per row, 8x8x3 input
    # two passes (fold 1 fits on the first batch, fold 2 on the second), the clip only widening
    assert [c[0] for c in calls] == [16, 16] and all(c[1] == refine_mod.WIDER for c in calls)

    def outputs(model, rows):
        with torch.no_grad():
            out = model(torch.from_numpy(rows))
        return (next(iter(out.values())) if isinstance(out, dict) else out).numpy()

    ref = outputs(base.float_model, x)
    q0 = outputs(base.quant_model, x)
    # the default's score: its fake-quant model on all 32 calibration rows (both folds' held-out)
    assert abs(imp["stages"][0]["worst_output_sqnr_db"] - sqnr(ref, q0)) < 2e-3
    refined = imp["stages"][1]
    assert refined["name"] == "bias_correction" and "fold" in refined
    # these rows' means differ from zero: the correction gains and is kept
    assert imp["kept"] == "bias_correction"
    rows = slice(16, 32) if refined["fold"] == 0 else slice(0, 16)   # the kept model's held-out rows
    q1 = outputs(res.quant_model, x)
    assert sqnr(ref[rows], q1[rows]) >= sqnr(ref[rows], q0[rows])
    assert refined["gain_db"] >= MARGIN_DB


def test_the_fold_kept_must_gain_the_margin_on_its_own_rows():
    """Pooled over both folds a stage may pass while the model kept gains nothing on the rows
    it was not fitted on: then it is not kept; a fold that gains the margin itself is."""
    default = Stage("default", [20.0, 30.0], halves=[[20.0, 30.0], [20.0, 30.0]])
    flat_then_small = Stage("x", [20.0 + MARGIN_DB, 30.5],
                            halves=[[20.0, 30.2], [20.0 + MARGIN_DB / 2, 30.8]], per_fold=True)
    assert not _better(flat_then_small, default)
    second_gains = Stage("y", [20.0 + MARGIN_DB, 30.5],
                         halves=[[20.0, 30.2], [20.0 + 2 * MARGIN_DB, 30.8]], per_fold=True)
    assert _better(second_gains, default) and second_gains.fold == 1
    both_gain = Stage("z", [20.0 + 2 * MARGIN_DB, 30.5],
                      halves=[[20.0 + MARGIN_DB, 30.2], [20.0 + 3 * MARGIN_DB, 30.8]], per_fold=True)
    assert _better(both_gain, default) and both_gain.fold == 0
    one_output_worse = Stage("w", [20.0 + MARGIN_DB, 30.5],
                             halves=[[20.0 + MARGIN_DB, 29.9], [20.0 + 2 * MARGIN_DB, 30.8]], per_fold=True)
    assert _better(one_output_worse, default) and one_output_worse.fold == 1
