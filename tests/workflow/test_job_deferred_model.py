"""The job builds the torch fake-quant twin only when something reads it: the report during
the job, a caller of the result on first access (once); the twin it builds then is the one the
exporters' ``fake_quant_graph`` builds from the same fused graph and record.

Reference: ``fake_quant_graph(result.graph.fused, result.records)`` built independently after
the job, and the fake-quant Caffe model the job wrote, loaded back by ``load_caffe``."""
from __future__ import annotations

import torch

import amct_torch
from amct_torch.caffe.graph import load_caffe
from amct_torch.export import fake_quant_graph
from amct_torch.workflow import job
from amct_torch.workflow.examples import example_data, example_model


def _calib():
    x, _ = example_data("calib")
    return [torch.from_numpy(x[i:i + 20]) for i in (0, 20)]


def _counting(monkeypatch) -> list:
    built: list = []
    real = job.fake_quant_graph

    def counted(*a, **k):
        built.append(1)
        return real(*a, **k)
    monkeypatch.setattr(job, "fake_quant_graph", counted)
    return built


def _out(model, x):
    return next(iter(model(x).values()))


def test_no_report_builds_the_twin_on_first_access_only(tmp_path, monkeypatch):
    built = _counting(monkeypatch)
    proto, weights = example_model()
    res = amct_torch.quantize(proto, weights, _calib(), output=str(tmp_path / "m"), batch_num=2,
                              device="cpu", report=False, quiet=True)
    assert built == []  # the job itself never needed it
    x = torch.from_numpy(example_data("test")[0][:16])
    twin = res.quant_model
    assert built == [1] and res.quant_model is twin  # built once
    ref = fake_quant_graph(res.graph.fused, res.records)
    torch.testing.assert_close(_out(twin, x), _out(ref, x), rtol=0, atol=0)
    written = load_caffe(res.files["fake_quant_model"], res.files["fake_quant_weights"])
    torch.testing.assert_close(_out(twin, x), _out(written, x), rtol=1e-5, atol=1e-5)
    assert not torch.equal(_out(twin, x), _out(res.float_model, x))  # it is quantized


def test_report_builds_the_twin_during_the_job(tmp_path, monkeypatch):
    built = _counting(monkeypatch)
    proto, weights = example_model()
    res = amct_torch.quantize(proto, weights, _calib(), output=str(tmp_path / "m"), batch_num=2,
                              device="cpu", report=True, report_batches=1, quiet=True)
    assert built == [1] and res.report
    x = torch.from_numpy(example_data("test")[0][:16])
    torch.testing.assert_close(_out(res.quant_model, x),
                               _out(fake_quant_graph(res.graph.fused, res.records), x), rtol=0, atol=0)
    assert built == [1]
