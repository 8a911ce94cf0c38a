"""The job's options are declared once (``workflow/options.py``): ``quantize``'s signature and
argument checks and the ``calibrate`` command's one-to-one arguments agree with those fields."""
from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import amct_torch
from amct_torch.cli import build_parser
from amct_torch.workflow.options import QUANTIZE_ARGS, QuantizeOptions


def test_quantize_takes_exactly_the_fields_with_their_defaults():
    params = inspect.signature(amct_torch.quantize).parameters
    names = [f.name for f in fields(QuantizeOptions)]
    assert list(params)[:5] == names[:5] and sorted(params) == sorted(names)  # keywords after output
    for f in fields(QuantizeOptions):
        if f.default is not MISSING:
            assert params[f.name].default == f.default, f.name
    assert set(QUANTIZE_ARGS) == {f.name for f in fields(QuantizeOptions) if f.metadata["arg"]}
    assert "model_file" in QUANTIZE_ARGS and "onnx_target" in QUANTIZE_ARGS


def test_calibrate_arguments_default_to_the_fields_defaults():
    args = build_parser().parse_args(["calibrate", "m.prototxt", "m.caffemodel", "data"])
    one_to_one = [f for f in fields(QuantizeOptions) if f.metadata.get("cli")]
    assert {f.name for f in one_to_one} >= {"config", "output", "batch_num", "save_type", "improve", "checkpoint"}
    for f in one_to_one:
        assert getattr(args, f.name) == f.metadata["cli"].get("default", f.default), f.name
    parsed = build_parser().parse_args(["calibrate", "m", "w", "d", "--batch-num", "3", "--skip-layers", "a,,b",
                                        "--improve", "cle", "-o", "x/y"])
    assert (parsed.batch_num, parsed.skip_layers, parsed.improve, parsed.output) == (3, ["a", "b"], ("cle",), "x/y")
