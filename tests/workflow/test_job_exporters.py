"""The one-call job writes the output formats through the exporter interface only: what it plans
and writes is the union of the wanted exporters' kinds, and a format registered from outside
(here a small text file, without touching the job) is planned, written, committed and removed
by a rerun that does not write it; a failing exporter check publishes nothing; a format refuses
its own settings in ``QuantizeOptions.validate`` (``Exporter.check_options``) before any file is
read or written, and ``validate`` itself knows no format.

References written plainly here: AMCT's file names per ``save_type``, the text the extra
format writes, and the folder's contents after each run."""
from __future__ import annotations

import inspect
import os
import re

import pytest
import torch

import amct_torch
from amct_torch import AmctError, ExportError
from amct_torch.export import formats
from amct_torch.export.exporter import Exporter, ExportInputs
from amct_torch.workflow.examples import example_data, example_model
from amct_torch.workflow.options import QuantizeOptions

CAFFE_FILES = {
    "Fakequant": {"fake_quant_model": "_fake_quant_model.prototxt",
                  "fake_quant_weights": "_fake_quant_weights.caffemodel", "quant": "_quant.json"},
    "Deploy": {"deploy_model": "_deploy_model.prototxt", "deploy_weights": "_deploy_weights.caffemodel",
               "quant": "_quant.json"},
}
ONNX_FILES = {"onnx_float": "_float.onnx", "onnx": "_quant.onnx"}
OWN_FILES = {"config": "_quant_config.json", "record": "_record.txt"}


def _calib():
    x, _ = example_data("calib")
    return [torch.from_numpy(x[i:i + 20]) for i in (0, 20)]


def _run(out: str, **kw):
    return amct_torch.quantize(*example_model(), _calib(), output=out, batch_num=2, device="cpu",
                               quiet=True, report=False, **kw)


class Notes(Exporter):
    """An extra format: one text file with the quantized layers' names, one per line."""

    label = "notes"
    suffixes = {"notes": "_notes.txt"}
    wanted = True
    calls: list = []

    def kinds(self) -> list[str]:
        return ["notes"] if type(self).wanted else []

    def check(self, graph) -> None:
        Notes.calls.append("check")

    def write(self, inputs: ExportInputs) -> dict[str, str]:
        path = self.path(inputs.prefix, "notes")
        with open(path, "w") as f:
            f.write("".join(f"{name}\n" for name in sorted(inputs.records)))
        return {"notes": path}

    def discard(self) -> None:
        Notes.calls.append("discard")


@pytest.fixture
def notes(monkeypatch):
    """``Notes`` registered for this test only (the registry's list restored after)."""
    monkeypatch.setattr(formats, "EXPORTERS", list(formats.EXPORTERS))
    monkeypatch.setattr(Notes, "wanted", True)
    monkeypatch.setattr(Notes, "calls", [])
    formats.register_exporter(Notes)
    return Notes


@pytest.mark.parametrize("save_type,onnx", [("Fakequant", False), (None, True), ("Deploy", True)])
def test_planned_and_written_files_are_the_wanted_exporters_kinds(tmp_path, save_type, onnx):
    out = str(tmp_path / "m")
    want = {**OWN_FILES, **CAFFE_FILES.get(save_type, {}), **(ONNX_FILES if onnx else {})}
    opts = QuantizeOptions(*example_model(), _calib(), output=out, save_type=save_type, onnx=onnx, report=False)
    planned = formats.planned_outputs(out, formats.exporters_for(opts), report=False)
    assert planned == {k: os.path.abspath(out + s) for k, s in want.items()}
    res = _run(out, save_type=save_type, onnx=onnx)
    assert res.files == planned
    assert sorted(os.listdir(tmp_path)) == sorted("m" + s for s in want.values())


def test_a_registered_format_is_planned_written_committed_and_removed_on_rerun(tmp_path, notes):
    out = str(tmp_path / "m")
    res = _run(out, save_type="Deploy")
    assert res.files["notes"] == os.path.abspath(out + "_notes.txt")
    with open(out + "_notes.txt") as f:
        assert f.read().splitlines() == sorted(res.records)
    assert sorted(os.listdir(tmp_path)) == sorted(
        "m" + s for s in [*OWN_FILES.values(), *CAFFE_FILES["Deploy"].values(), "_notes.txt"])
    assert notes.calls == ["check", "discard"]

    notes.wanted = False  # the rerun does not write it: the earlier run's file goes
    again = _run(out, save_type="Deploy")
    assert "notes" not in again.files
    assert again.removed == [os.path.abspath(out + "_notes.txt")]
    assert sorted(os.listdir(tmp_path)) == sorted("m" + s for s in [*OWN_FILES.values(),
                                                                   *CAFFE_FILES["Deploy"].values()])


def test_a_failing_exporter_check_publishes_nothing(tmp_path, notes, monkeypatch):
    written = []

    def refuse(self, graph):
        raise ExportError("notes cannot be written for this model", file=graph.model_file)

    monkeypatch.setattr(Notes, "check", refuse)
    monkeypatch.setattr(Notes, "write", lambda self, inputs: written.append(1))
    out = tmp_path / "out" / "m"
    with pytest.raises(ExportError, match="notes cannot be written"):
        _run(str(out), onnx=True)
    assert written == [] and notes.calls == ["discard"]
    assert not out.parent.exists()  # the folder the run made is gone with its staging folder




def test_the_exporters_are_discarded_and_nothing_published_when_closing_the_data_fails(tmp_path, notes,
                                                                                        monkeypatch):
    from amct_torch.inputs.plan import BatchPlan

    def fail(self):
        raise RuntimeError("the data would not close")

    monkeypatch.setattr(BatchPlan, "close", fail)
    out = tmp_path / "out" / "m"
    with pytest.raises(RuntimeError, match="would not close"):
        _run(str(out))
    assert notes.calls == ["check", "discard"]
    assert not (out.parent / ".m.amct-partial").exists()


def test_a_format_refuses_its_own_settings_before_any_file_is_read_or_written(tmp_path, notes, monkeypatch):
    def no_skipped_layers(cls, opts):  # the notes list every layer: skipping some would drop them
        if opts.skip_layers:
            raise AmctError("notes list every layer: leave skip_layers out")

    monkeypatch.setattr(Notes, "check_options", classmethod(no_skipped_layers))
    out = tmp_path / "out" / "m"
    with pytest.raises(AmctError, match="notes list every layer"):
        _run(str(out), skip_layers=["conv1"])
    assert notes.calls == []  # refused before the model was loaded (the format's check runs after)
    assert os.listdir(tmp_path) == []  # no folder, no staging, no file
    _run(str(out))  # the same format without the refused setting is written
    assert (tmp_path / "out" / "m_notes.txt").exists()


@pytest.mark.parametrize("kw,message", [
    (dict(onnx_speed=True), "ask for it too"),
    (dict(onnx="uint8", onnx_target="tensorrt", activation_offset=False), "would be ignored"),
])
def test_onnx_settings_are_checked_by_the_onnx_exporter_not_by_validate(kw, message, monkeypatch):
    opts = QuantizeOptions(*example_model(), _calib(), **kw)
    with pytest.raises(AmctError, match=message):
        opts.validate()
    # without the ONNX format registered, nothing else knows its settings
    monkeypatch.setattr(formats, "EXPORTERS", [c for c in formats.EXPORTERS if c.label != "ONNX"])
    assert QuantizeOptions(*example_model(), _calib(), **kw).validate().onnx_target == opts.onnx_target
    # and validate's source names no format: ONNX fields at most read, never checked there
    source = "".join(inspect.getsource(f) for f in (QuantizeOptions.validate, QuantizeOptions._check_dropped))
    source = re.sub(r"self\.onnx\w*", "", source)
    for name in ("onnx", "tensorrt", "openvino", "target", "caffe"):
        assert name not in source.lower(), name
