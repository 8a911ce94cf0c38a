"""The job's options are declared once (``workflow/options.py``): ``quantize``'s signature,
argument checks and docstring, and the ``calibrate`` command's arguments agree with those fields;
each flag given on the command line reaches its field with the value a user means."""
from __future__ import annotations

import inspect
import re
from dataclasses import MISSING, fields

import pytest

import amct_torch
from amct_torch.arguments import check_values
from amct_torch.cli import build_parser
from amct_torch.commands.shared import command_fields, option_values
from amct_torch.errors import AmctError
from amct_torch.workflow.option_declaration import flags_of
from amct_torch.workflow.options import QUANTIZE_ARGS, QuantizeOptions

POSITIONALS = ["m.prototxt", "m.caffemodel", "data"]

#: for each field with calibrate arguments: a command line that sets it to a value other than
#: its default, and that value as the Python API takes it (written out by hand)
ROUND_TRIPS = {
    "model_file": ([], "m.prototxt"),
    "weights_file": ([], "m.caffemodel"),
    "calibration_data": ([], "data"),
    "config": (["-c", "q.cfg"], "q.cfg"),
    "output": (["--output", "out/m"], "out/m"),
    "batch_num": (["--batch-num", "3"], 3),
    "batch_size": (["--batch-size", "5"], 5),
    "device": (["--device", "cpu"], "cpu"),
    "skip_layers": (["--skip-layers", "conv1,,fc8"], ["conv1", "fc8"]),
    "activation_offset": (["--no-activation-offset"], False),
    "save_type": (["--save-type", "Deploy"], "Deploy"),
    "onnx": (["--onnx", "--onnx-activations", "int8"], "int8"),
    "onnx_speed": (["--onnx", "--onnx-quantize-eltwise"], True),
    "onnx_outputs": (["--onnx", "--onnx-outputs", "a,b"], ["a", "b"]),
    "report": (["--report-batches", "0"], False),
    "report_batches": (["--report-batches", "5"], 5),
    "ifmr_mode": (["--ifmr-mode", "exact"], "exact"),
    "quiet": (["-q"], True),
    "improve": (["--improve", "bias_correction,cle"], ("cle", "bias_correction")),
    "distributed": (["--distributed"], True),
    "checkpoint": (["--checkpoint", "c.ckpt"], "c.ckpt"),
    "onnx_target": (["--onnx", "--onnx-target", "tensorrt"], "tensorrt"),
    "allow_unknown_fields": (["--allow-unknown-fields"], True),
}


def _options(*argv: str) -> dict:
    return option_values(build_parser().parse_args(["calibrate", *POSITIONALS, *argv]))


def test_quantize_takes_exactly_the_fields_with_their_defaults():
    params = inspect.signature(amct_torch.quantize).parameters
    names = [f.name for f in fields(QuantizeOptions)]
    assert list(params)[:5] == names[:5] and sorted(params) == sorted(names)  # keywords after output
    for f in fields(QuantizeOptions):
        if f.default is not MISSING:
            assert params[f.name].default == f.default, f.name
    assert set(QUANTIZE_ARGS) == {f.name for f in fields(QuantizeOptions) if f.metadata["arg"]}
    assert "model_file" in QUANTIZE_ARGS and "onnx_target" in QUANTIZE_ARGS


def test_every_field_has_help_and_the_docstring_lists_exactly_the_fields():
    for f in fields(QuantizeOptions):
        assert isinstance(f.metadata["help"], str) and len(f.metadata["help"]) > 5, f.name
    doc = inspect.getdoc(amct_torch.quantize)
    named = re.findall(r"^``(\w+)``:", doc, flags=re.MULTILINE)
    assert named == [f.name for f in fields(QuantizeOptions)]
    flat = " ".join(doc.split())
    assert "``improve``: opt-in improvements beyond AMCT" in flat
    assert "``save_type``: Caffe models to write: Fakequant, Deploy or Both (default); None: the record only" in flat


def test_each_flag_reaches_its_field_with_a_value_other_than_the_default():
    with_flags = {f.name for f in command_fields()} - {"preprocess"}  # below: a group of its own
    assert sorted(with_flags) == sorted(ROUND_TRIPS)  # a new field with a flag belongs in the table
    defaults = {f.name: f.default for f in fields(QuantizeOptions)}
    for name, (argv, want) in ROUND_TRIPS.items():
        got = _options(*argv)
        assert got[name] == want, (name, argv, got[name])
        if argv:
            assert want != defaults[name] and _options()[name] != want, name
        # what the command passes on is a value the Python API accepts as it is
        assert check_values("quantize()", {name: got[name]}, QUANTIZE_ARGS)[name] == want, name
    assert _options("--report-batches", "0")["report_batches"] == 1  # a held-out batch count the API accepts
    assert _options("--onnx")["onnx"] is True


def test_without_flags_the_fields_keep_their_defaults():
    got = _options()
    for f in command_fields():
        if f.default is not MISSING and f.name not in ("device", "preprocess"):
            assert got[f.name] == f.default, f.name
    assert got["device"] == "auto"  # the command's spelling of "cuda if available"


def test_the_preprocessing_group_reaches_the_preprocess_field():
    pre = _options("--mean", "104,117,123", "--scale", "0.5", "--channel-order", "rgb", "--crop", "24")["preprocess"]
    assert (pre.mean, pre.scale, pre.channel_order, pre.crop) == ([104.0, 117.0, 123.0], 0.5, "rgb", [24])


@pytest.mark.parametrize("argv", [["--onnx-activations", "int8"], ["--onnx-quantize-eltwise"],
                                  ["--onnx-outputs", "a"], ["--onnx-target", "openvino"]])
def test_a_flag_that_shapes_the_onnx_model_is_refused_without_onnx(argv):
    with pytest.raises(AmctError, match=f"^{argv[0]} shapes what --onnx writes: add --onnx"):
        _options(*argv)


def test_every_flag_that_needs_another_names_a_field_with_flags():
    names = {f.name for f in fields(QuantizeOptions)}
    needs = [fl.needs for f in command_fields() for fl in flags_of(f) if fl.needs]
    assert needs and all(n in names and flags_of(next(f for f in fields(QuantizeOptions) if f.name == n))
                         for n in needs)


def test_a_flag_in_the_place_of_the_check_is_refused():
    from amct_torch.workflow.option_declaration import flag, option
    with pytest.raises(TypeError, match="cli="):
        option(None, "some help", flag("--some-flag"))
