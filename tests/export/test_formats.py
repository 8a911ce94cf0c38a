"""The output formats as the job sees them: each exporter's kinds for a run's options, every
file name a prefix may hold (AMCT's, written out below), a new format's names refused when
taken, and the ONNX float model written ahead only for a target written as built."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import amct_torch.export.onnx.float_ahead as float_ahead
from amct_torch.export import formats
from amct_torch.export.caffe.exporter import CaffeExporter
from amct_torch.export.exporter import Exporter
from amct_torch.export.onnx.exporter import OnnxExporter
from amct_torch.export.onnx.runtime_targets import TARGETS

AMCT_NAMES = ["_quant_config.json", "_record.txt", "_fake_quant_model.prototxt", "_fake_quant_weights.caffemodel",
              "_deploy_model.prototxt", "_deploy_weights.caffemodel", "_quant.json", "_layer_report.json",
              "_report.html", "_float.onnx", "_quant.onnx"]


def _opts(**kw):
    base = dict(save_type="Both", onnx=False, onnx_target="onnxruntime", onnx_outputs=None, onnx_speed=False,
                model_file="m.prototxt", onnx_activations="uint8")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("save_type,kinds", [
    (None, []),
    ("Fakequant", ["fake_quant_model", "fake_quant_weights", "quant"]),
    ("Deploy", ["deploy_model", "deploy_weights", "quant"]),
    ("Both", ["fake_quant_model", "fake_quant_weights", "deploy_model", "deploy_weights", "quant"]),
])
def test_caffe_kinds_follow_save_type(save_type, kinds):
    assert CaffeExporter(_opts(save_type=save_type)).kinds() == kinds


@pytest.mark.parametrize("onnx,kinds", [(False, []), (True, ["onnx_float", "onnx"]), ("int8", ["onnx_float", "onnx"])])
def test_onnx_kinds_follow_onnx(onnx, kinds):
    assert OnnxExporter(_opts(onnx=onnx)).kinds() == kinds


def test_exporters_for_keeps_the_wanted_ones_in_writing_order():
    assert [type(e) for e in formats.exporters_for(_opts(save_type=None, onnx=True))] == [OnnxExporter]
    assert [type(e) for e in formats.exporters_for(_opts(onnx=True))] == [CaffeExporter, OnnxExporter]
    assert formats.exporters_for(_opts(save_type=None)) == []


def test_every_name_of_a_prefix_is_amcts_once():
    assert sorted(formats.prefix_suffixes()) == sorted(AMCT_NAMES)
    assert sorted(formats.prefix_outputs("out/m")) == sorted("out/m" + s for s in AMCT_NAMES)
    assert formats.prefix_outputs("out/m") == ["out/m" + s for s in formats.prefix_suffixes()]  # in that order


def test_a_suffix_already_taken_is_refused(monkeypatch):
    monkeypatch.setattr(formats, "EXPORTERS", list(formats.EXPORTERS))

    class Twin(Exporter):
        suffixes = {"copy": "_quant.onnx"}

    with pytest.raises(ValueError, match="_quant.onnx"):
        formats.register_exporter(Twin)
    assert Twin not in formats.EXPORTERS


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_float_model_is_written_ahead_only_for_a_streamed_target(monkeypatch, target):
    made = []

    class Recorder:
        def __init__(self, graph, prefix, **kw):
            made.append(prefix)

        def start(self):
            made.append("start")

        def discard(self):
            made.append("discard")

    monkeypatch.setattr(float_ahead, "FloatAhead", Recorder)
    exporter = OnnxExporter(_opts(onnx=True, onnx_target=target))
    exporter.prepare(object(), "stage/m")
    exporter.start()
    exporter.discard()
    assert made == (["stage/m", "start", "discard"] if TARGETS[target].streamed else [])


def test_plan_outputs_names_every_file_of_the_run(tmp_path):
    """One call answers the job's planning: the exporters asked for, the final path of each
    file (AMCT's names under the prefix, written out here) and the names the prefix owns."""
    out = str(tmp_path / "m")
    plan = formats.plan_outputs(SimpleNamespace(**vars(_opts(save_type="Deploy", onnx=True)), output=out,
                                                report=True))
    assert [type(e) for e in plan.exporters] == [CaffeExporter, OnnxExporter]
    assert plan.finals == {k: out + s for k, s in [
        ("config", "_quant_config.json"), ("record", "_record.txt"), ("deploy_model", "_deploy_model.prototxt"),
        ("deploy_weights", "_deploy_weights.caffemodel"), ("quant", "_quant.json"), ("onnx_float", "_float.onnx"),
        ("onnx", "_quant.onnx"), ("report", "_layer_report.json"), ("html_report", "_report.html")]}
    assert sorted(plan.suffixes) == sorted(AMCT_NAMES)
    no_report = formats.plan_outputs(SimpleNamespace(**vars(_opts(save_type=None)), output=out, report=False))
    assert no_report.exporters == [] and list(no_report.finals) == ["config", "record"]
