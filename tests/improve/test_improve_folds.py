"""The stage guard's rows (``improve/pipeline.py``, ``improve/folds.py``): the job judges the
stages on the data beyond its calibration batches where it has at least ``HELD_ROWS`` such
rows (the refining pass then runs once), else on every calibration row cross-fitted (each row
scored by a pass fitted without it, the model kept fitted on all rows); with too few rows the
improvements are skipped with a warning, never an exception."""
from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch

import amct_torch
from amct_torch.improve import folds, pipeline
from helpers.caffe_nets import rand
from helpers.improve_nets import conv_fc_net

KW = dict(save_type=None, report=False, quiet=True, device="cpu")


def test_blocks_hold_out_every_row_once_and_the_fold_fits_on_the_others():
    x = torch.arange(10, dtype=torch.float32).reshape(10, 1)
    bl = folds.blocks(10, 4)
    assert sorted(torch.cat(bl).tolist()) == list(range(10)) and len(bl) == 4
    (rows,), n_fit = folds.fold_data((x,), bl[1])
    others = [v for v in range(10) if v not in bl[1].tolist()]
    assert rows.flatten().tolist() == others          # the other rows, in order
    assert n_fit == len(others) - len(others) // 4    # their last quarter guards the pass
    assert len(folds.blocks(3, 4)) == 3               # never an empty block


def sqnr(ref: np.ndarray, q: np.ndarray) -> float:
    ref, q = ref.astype(np.float64), q.astype(np.float64)
    return 10 * math.log10((ref ** 2).sum() / ((q - ref) ** 2).sum())


def outputs(model, rows: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(rows))
    return (next(iter(out.values())) if isinstance(out, dict) else out).numpy()


def spy_refine(monkeypatch) -> list:
    from amct_torch.improve import refine as refine_mod
    calls = []
    real = refine_mod.refine

    def spy(*a, **kw):   # each pass: its rows and fitting rows
        calls.append((int(a[2][0].shape[0]), int(a[3])))
        return real(*a, **kw)
    monkeypatch.setattr(refine_mod, "refine", spy)
    return calls


def test_job_judges_on_the_rows_beyond_calibration(tmp_path, monkeypatch):
    calls = spy_refine(monkeypatch)
    proto, weights = conv_fc_net(tmp_path, convs=1, size=8)
    x = rand(32 + 80, 3, 8, 8, seed=7) + 0.5       # 32 calibrate (4 x 8), 80 beyond
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), batch_num=4,
                               batch_size=8, **KW)
    res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "b" / "m"), batch_num=4,
                              batch_size=8, improve="bias_correction", **KW)
    imp = res.improvement
    # 64 rows beyond calibration: 8 batches of 8; no cross-fitting, the pass runs once
    assert (imp["held_out_rows"], imp["cross_fitted_rows"], imp["rows"]) == (64, 0, 64)
    assert calls == [(32, 24)]
    held = x[32:96]
    ref = outputs(base.float_model, held)
    d0 = sqnr(ref, outputs(base.quant_model, held))
    assert abs(imp["stages"][0]["worst_output_sqnr_db"] - d0) < 2e-3
    st = imp["stages"][1]
    d1 = sqnr(ref, outputs(res.quant_model if imp["kept"] != "default" else
                           pipeline_model(proto, weights, x, tmp_path), held))
    assert abs(st["worst_output_sqnr_db"] - d1) < 2e-3
    assert abs(st["output_gain_db"][0] - (d1 - d0)) < 2e-3   # one output: its gain is the SQNR's
    assert st["passed"] == (imp["kept"] == "bias_correction")


def pipeline_model(proto, weights, x, tmp_path):
    """The refined model whatever the guard says (its choice forced)."""
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "_choose", lambda stages: stages[-1])
        return amct_torch.quantize(proto, weights, x, output=str(tmp_path / "f" / "m"), batch_num=4,
                                   batch_size=8, improve="bias_correction", **KW).quant_model


def test_job_cross_fits_every_calibration_row_when_no_more_data(tmp_path, monkeypatch):
    calls = spy_refine(monkeypatch)
    proto, weights = conv_fc_net(tmp_path, convs=1, size=8)
    x = rand(32, 3, 8, 8, seed=7) + 0.5
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), batch_num=2,
                               batch_size=16, **KW)
    res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "b" / "m"), batch_num=2,
                              batch_size=16, improve="bias_correction", **KW)
    imp = res.improvement
    assert (imp["held_out_rows"], imp["cross_fitted_rows"], imp["folds"]) == (0, 32, folds.FOLDS_SMALL)
    # the model kept: fitted on all rows (16 fit, the last batch guards); then one pass per
    # fold on the 24 other rows (18 fit, 6 guard)
    assert calls == [(32, 16)] + [(24, 18)] * folds.FOLDS_SMALL
    ref = outputs(base.float_model, x)
    assert abs(imp["stages"][0]["worst_output_sqnr_db"] - sqnr(ref, outputs(base.quant_model, x))) < 2e-3


def test_too_few_rows_warn_and_keep_the_default(tmp_path, caplog):
    proto, weights = conv_fc_net(tmp_path, convs=1, size=8)
    x = rand(4, 3, 8, 8, seed=7)
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), batch_num=4,
                               batch_size=1, **KW)
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "a" / "m"), batch_num=4,
                                  batch_size=1, improve="all", **KW)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "not applied" in warned[0] and "4 row(s)" in warned[0] and "4 calibration" in warned[0]
    assert "cle, output_ranges, adaround, bias_correction" in warned[0] and "\n" not in warned[0]
    assert res.improvement["kept"] == "default" and res.improvement["stages"] == []
    assert open(res.files["record"], "rb").read() == open(base.files["record"], "rb").read()
    # one calibration sample and rows beyond it: equalization is judged, the refining pass
    # (which needs a row to fit and one to guard) is skipped with the reason
    y = rand(1 + 64, 3, 8, 8, seed=8)
    res = amct_torch.quantize(proto, weights, y, output=str(tmp_path / "o" / "m"), batch_num=1,
                              batch_size=1, improve="all", **KW)
    assert "at least 2 calibration samples" in res.improvement["skipped"]
    assert [s["name"] for s in res.improvement["stages"]] in (["default"], ["default", "cle"])
    assert pipeline.summary_line(res.improvement).startswith("improve: kept ")


def test_cli_improve_with_batch_size_one_warns_in_one_line(tmp_path, capsys):
    from amct_torch.cli import main
    proto, weights = conv_fc_net(tmp_path, convs=1, size=8)
    np.save(tmp_path / "one.npy", rand(1, 3, 8, 8, seed=9))
    code = main(["calibrate", proto, weights, str(tmp_path / "one.npy"), "--batch-size", "1", "--batch-num", "1",
                 "--improve", "all", "--device", "cpu", "--output", str(tmp_path / "out" / "m")])
    err = capsys.readouterr()
    assert code == 0, err.err
    assert "Traceback" not in err.err + err.out
    lines = [ln for ln in (err.err + err.out).splitlines() if "not applied" in ln]
    assert len(lines) >= 1 and all("1 calibration sample(s), 0 beyond" in ln and "cle, output_ranges" in ln for ln in lines)
    assert os.path.exists(str(tmp_path / "out" / "m") + "_record.txt")


def test_a_net_joining_the_samples_of_a_batch_is_judged_sample_by_sample(tmp_path):
    """A Reshape with a literal batch dimension of 1 (RFB/slim's ``dim: 1 dim: -1 dim: 2``)
    joins a batch's samples into one output row: the guard runs its rows one at a time, so its
    statistic has a row per sample."""
    from helpers.caffe_nets import make_net
    body = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "head" type: "Convolution" bottom: "conv" top: "head" convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "flat" type: "Reshape" bottom: "head" top: "flat" reshape_param { shape { dim: 1 dim: -1 dim: 2 } } }
"""
    blobs = {"conv": [rand(4, 3, 3, 3, seed=1, scale=0.4), rand(4, seed=2, scale=0.1)],
             "head": [rand(2, 4, 1, 1, seed=3, scale=0.5), rand(2, seed=4, scale=0.1)]}
    proto, weights = make_net(tmp_path, body, {"data": [1, 3, 8, 8]}, blobs)
    x = rand(32 + 64, 3, 8, 8, seed=5) + 0.5
    kw = dict(batch_num=4, batch_size=8, **KW)
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), **kw)
    res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "b" / "m"), improve="bias_correction", **kw)
    imp = res.improvement
    assert imp["held_out_rows"] == 64
    held = x[32:96]
    ref = np.stack([outputs(base.float_model, held[i:i + 1]) for i in range(64)])
    q = np.stack([outputs(base.quant_model, held[i:i + 1]) for i in range(64)])
    assert abs(imp["stages"][0]["worst_output_sqnr_db"] - sqnr(ref, q)) < 2e-3
    # a standard error from 64 rows (one joined row would give none)
    assert imp["stages"][1]["output_error_db"][0] > 0


def test_a_detector_whose_only_output_is_a_detection_output_skips_with_a_warning(tmp_path, caplog):
    """A DetectionOutput's shape follows the detections, so the guard has no output to score:
    the improvements are skipped with one warning and the record is AMCT's."""
    from helpers.ssd import ssd_net
    proto, weights = ssd_net(tmp_path)
    x = rand(16 + 64, 3, 64, 64, seed=3)
    kw = dict(batch_num=2, batch_size=8, **KW)
    base = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "d" / "m"), **kw)
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "a" / "m"), improve="all", **kw)
    warned = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(warned) == 1 and "DetectionOutput" in warned[0]
    assert res.improvement["kept"] == "default" and res.improvement["stages"] == []
    assert open(res.files["record"], "rb").read() == open(base.files["record"], "rb").read()
