"""Job progress: every phase of the one-call job is named on the bar and logged with its time."""
from __future__ import annotations

import logging
import re

import amct_torch
from amct_torch.runtime.progress import JobProgress
from amct_torch.workflow.examples import example_data, example_model


def test_quantize_logs_each_phase_in_order(tmp_path, caplog):
    proto, weights = example_model()
    x, _ = example_data("calib")
    with caplog.at_level(logging.INFO, logger="amct_torch"):
        amct_torch.quantize(proto, weights, x[:40], output=str(tmp_path / "m"), batch_num=2,
                            report=True, report_batches=1, quiet=True)
    timed = [m.split(":")[0] for m in caplog.messages if re.fullmatch(r"[a-zA-Z +-]+: \d+\.\d\d s", m)]
    assert timed == ["reading the model", "BN fusion + ARQ", "calibrating", "writing the Caffe models",
                     "building the fake-quant model", "per-layer report", "committing the outputs"]


def test_bar_names_the_running_phase_and_counts_them(capsys):
    prog = JobProgress(2, enabled=True)
    prog.start("first phase")
    prog.start("second phase")
    prog.close()
    err = capsys.readouterr().err
    assert "first phase: 0/2 phases" in err and "second phase: 1/2 phases" in err
    assert set(prog.times) == {"first phase", "second phase"} and all(v >= 0 for v in prog.times.values())


def test_caffe_and_onnx_models_are_written_in_one_phase(tmp_path, caplog):
    """With ONNX the two exports run side by side: one phase, and every file written."""
    proto, weights = example_model()
    x, _ = example_data("calib")
    with caplog.at_level(logging.INFO, logger="amct_torch"):
        res = amct_torch.quantize(proto, weights, x[:40], output=str(tmp_path / "m"), batch_num=2,
                                  onnx=True, report=False, quiet=True)
    timed = [m.split(":")[0] for m in caplog.messages if re.fullmatch(r"[a-zA-Z +-]+: \d+\.\d\d s", m)]
    assert timed == ["reading the model", "BN fusion + ARQ", "calibrating",
                     "writing the Caffe and ONNX models", "committing the outputs"]
    assert {"fake_quant_weights", "deploy_weights", "onnx_float", "onnx"} <= set(res.files)
    assert list(res.files).index("deploy_weights") < list(res.files).index("onnx_float")
