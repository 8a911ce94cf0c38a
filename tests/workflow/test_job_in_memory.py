"""The one-call job keeps its record in memory and publishes one run's whole set or nothing.

Checked from outside: which files the process opens and renames (Python's audit events, not
the job's own functions), the record AMCT's five calls write for the same batches, and the
folder contents after a refused or failed run.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import amct_torch
from amct_torch import ExportError, create_quant_config, init, quantize_model
from amct_torch.cli import main
from amct_torch.workflow.examples import example_data, example_model

#: audit events seen while a test listens (audit hooks cannot be removed: one, switched on/off)
_EVENTS: list = []
_LISTENING = [False]


def _hook(event: str, args: tuple) -> None:
    if _LISTENING[0] and event in ("open", "os.rename"):
        _EVENTS.append((event, args))


sys.addaudithook(_hook)


def _listen(fn):
    _EVENTS.clear()
    _LISTENING[0] = True
    try:
        return fn()
    finally:
        _LISTENING[0] = False


def _name(p) -> str:
    return os.fsdecode(p) if isinstance(p, (str, bytes, os.PathLike)) else ""


def _calib():
    x, _ = example_data("calib")
    return [torch.from_numpy(x[i:i + 20]) for i in (0, 20)]


def test_record_written_once_never_read_and_equal_to_amct_calls(tmp_path):
    proto, weights = example_model()
    out = str(tmp_path / "job" / "m")
    res = _listen(lambda: amct_torch.quantize(proto, weights, _calib(), output=out, batch_num=2,
                                              device="cpu", report=False, quiet=True))
    # a file object opened on a record, for reading (the commit's fsync opens each staged file
    # with os.open, mode None, and reads nothing)
    reads = [a[0] for e, a in _EVENTS if e == "open" and _name(a[0]).endswith("_record.txt")
             and isinstance(a[1], str) and not set(a[1]) & set("wax+")]
    # a record written atomically is renamed from its temp file onto its name in the staging
    # folder; the commit then renames it once more, onto the final name
    staged = [a for e, a in _EVENTS if e == "os.rename" and _name(a[1]).endswith("m_record.txt")
              and ".amct-partial" in _name(a[1])]
    assert reads == []
    assert len(staged) == 1
    assert res.files["record"] == os.path.abspath(out + "_record.txt")

    # AMCT's five calls on the same batches write the same bytes
    cfg, rec = str(tmp_path / "c.json"), str(tmp_path / "r.txt")
    create_quant_config(cfg, proto, weights, batch_num=2)
    graph = init(cfg, proto, weights, rec)
    model = quantize_model(graph, None, None)
    with torch.no_grad():
        for b in _calib():
            model(b)
    assert open(rec, "rb").read() == open(res.files["record"], "rb").read()
    assert res.records == amct_torch.read_record(rec)
    # the observers' summaries are the visual report's: a job without the report keeps none
    assert res.graph.session.summaries == {}


def test_a_job_with_the_report_keeps_every_observers_summary(tmp_path):
    res = amct_torch.quantize(*example_model(), _calib(), output=str(tmp_path / "m"), batch_num=2,
                              device="cpu", quiet=True)
    assert os.path.exists(res.files["html_report"])
    assert set(res.graph.session.summaries) == set(res.records)


def test_ghost_onnx_output_is_refused_before_calibration_and_nothing_is_published(tmp_path):
    proto, weights = example_model()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    pulled = []

    def batches():
        for b in _calib():
            pulled.append(b)
            yield b

    with pytest.raises(ExportError) as err:
        amct_torch.quantize(proto, weights, batches(), output=str(tmp_path / "out" / "m"),
                            batch_num=2, device="cpu", onnx=True, onnx_outputs=["ghost"], quiet=True)
    assert err.value.file == proto and "ghost" in str(err.value)
    assert pulled == []                                   # no calibration batch was read
    assert os.listdir(tmp_path / "out") == ["keep.txt"]   # no file of the run, no staging folder


def test_cli_ghost_onnx_output_exits_2_with_no_file_of_the_run(tmp_path, capsys):
    proto, weights = example_model()
    x, _ = example_data("calib")
    data = tmp_path / "calib.npy"
    np.save(data, x[:40])
    out = tmp_path / "out"
    rc = main(["calibrate", proto, weights, str(data), "--device", "cpu", "-q", "--batch-num", "2",
               "--onnx", "--onnx-outputs", "ghost", "-o", str(out / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and proto in err[0] and "ghost" in err[0], err
    assert not out.exists()   # the folder the run would have created is gone too


def test_onnx_failing_after_calibration_publishes_nothing(tmp_path, monkeypatch):
    """The ONNX models are in the same transaction as the record and the Caffe models: an
    export failing once everything else is staged leaves the earlier run's set as it was."""
    from amct_torch.export.onnx.exporter import OnnxExporter

    proto, weights = example_model()
    out = str(tmp_path / "m")
    first = amct_torch.quantize(proto, weights, _calib(), output=out, batch_num=2, device="cpu",
                                onnx=True, quiet=True)
    before = {p: open(p, "rb").read() for p in first.files.values()}

    def boom(*_a, **_k):
        raise ExportError("ONNX export: the disk said no", file=proto)

    monkeypatch.setattr(OnnxExporter, "write", boom)
    x, _ = example_data("calib")
    other = [torch.from_numpy(x[i:i + 20]) for i in (40, 60)]   # other data: another record
    with pytest.raises(ExportError):
        amct_torch.quantize(proto, weights, other, output=out, batch_num=2, device="cpu",
                            onnx=True, quiet=True)
    assert {p: open(p, "rb").read() for p in first.files.values()} == before
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in before)


def test_bad_computed_factors_name_the_caffemodel_and_the_layer(tmp_path):
    """A bias that cannot be an int32 in steps of scale_d·scale_w: the record has no file (it
    is computed in memory), so the error names where its values came from."""
    from helpers.caffe_nets import make_net, rand

    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
            'convolution_param { num_output: 2 kernel_size: 1 } }\n')
    proto, model = make_net(tmp_path, body, {"data": [1, 1, 4, 4]},
                            {"conv": [np.ones((2, 1, 1, 1), np.float32), np.full(2, 100.0, np.float32)]})
    data = rand(2, 1, 4, 4, seed=1, scale=1e-4)
    with pytest.raises(ExportError) as err:
        amct_torch.quantize(proto, model, data, output=str(tmp_path / "o" / "m"), batch_num=1,
                            device="cpu", report=False, quiet=True)
    assert err.value.file == model and err.value.layer == "conv"
    assert "computed factors" in str(err.value) and "int32 bias overflow" in str(err.value)
    assert not (tmp_path / "o").exists()
