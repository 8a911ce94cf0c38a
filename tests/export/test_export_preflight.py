"""Fail fast: whether the ONNX models can be written is checked before calibration; the
problem is reported naming the user's model file and the layer (CLI: one line, exit 2) and no
file of the run is written."""
from __future__ import annotations

import logging
import os

import numpy as np

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.export.onnx.preflight import onnx_preflight
from helpers.data import natural_images_bgr
from helpers.ssd import ssd_net


def test_preflight_names_model_and_layer(tmp_path, caplog):
    proto, model = ssd_net(tmp_path, eta=0.9)
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        problem = onnx_preflight(load_caffe(proto, model), proto)
    assert problem is not None and problem.file == proto and problem.layer == "detection_out"
    assert "eta" in str(problem) and proto in caplog.text
    ok_proto, ok_model = ssd_net(tmp_path, name="ok")
    assert onnx_preflight(load_caffe(ok_proto, ok_model), ok_proto) is None


def test_calibrate_exits_2_before_calibration_and_writes_nothing(tmp_path, capsys):
    proto, model = ssd_net(tmp_path, eta=0.9)
    data = tmp_path / "calib.npy"
    np.save(data, natural_images_bgr(size=64, count=4, seed=1) / 64.0)
    out = str(tmp_path / "out" / "ssd")
    rc = main(["calibrate", "-q", proto, model, str(data), "-o", out, "--onnx", "--report-batches", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert any(proto in line and "detection_out" in line and "eta" in line for line in err), err
    assert "/amct_" not in err[-1] and "record" not in err[-1]  # names the model, not a temp record
    assert not os.path.exists(os.path.dirname(out))  # no file of the run, nor its folder
