"""Wrong arguments for every function and class the package exports, with the argument each
error must name: a table shared by the tests and ``benchmarks/bench_hostile.py``.

Each row: (exported name, positional args, keyword args, the argument the message must name).
Files named in a row exist where the argument is not the wrong one, so that only that argument
is at fault.
"""
from __future__ import annotations

import os
from typing import Any

from amct_torch.workflow.examples import EXAMPLE_DIR

MODEL = os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt")
WEIGHTS = os.path.join(EXAMPLE_DIR, "lenet_digits.caffemodel")
DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")


def rows(work: str) -> list[tuple[str, tuple, dict, str]]:
    """The table; outputs go under ``work``."""
    out = os.path.join(work, "o", "m")
    q = dict(device="cpu", quiet=True, report=False)
    return [
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=b"out/m", **q), "output"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, preprocess="mean=104", **q), "preprocess"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, batch_num=2.0, **q), "batch_num"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, batch_size=True, **q), "batch_size"),
        ("quantize", (None, WEIGHTS, DATA), dict(output=out, **q), "model_file"),
        ("quantize", (MODEL, WEIGHTS, b"data.npz"), dict(output=out, **q), "calibration_data"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, skip_layers="conv1", **q), "skip_layers"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, save_type="both", **q), "save_type"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, onnx="fp16", **q), "onnx"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, report_batches=-1, device="cpu", quiet=True),
         "report_batches"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, quiet="no", device="cpu"), "quiet"),
        ("quantize", (MODEL, WEIGHTS, DATA), dict(output=out, device=0, quiet=True), "device"),
        ("Preprocess", (), dict(mean="104"), "mean"),
        ("Preprocess", (), dict(scale="2"), "scale"),
        ("Preprocess", (), dict(resize=2.5), "resize"),
        ("Preprocess", (), dict(channel_order="grb"), "channel_order"),
        ("load_caffe", (None, None), {}, "model_file"),
        ("load_caffe", (MODEL, 3), {}, "weights_file"),
        ("save_caffe", (None, out + ".prototxt", out + ".caffemodel"), {}, "gm"),
        ("write_net", ("net", out + ".prototxt"), {}, "net"),
        ("create_quant_config", (b"c.json", MODEL, WEIGHTS), {}, "config_file"),
        ("create_quant_config", (out + ".json", MODEL, WEIGHTS), dict(config_defination=5), "config_defination"),
        ("init", (None, MODEL, WEIGHTS, out + "_record.txt"), {}, "config_file"),
        ("quantize_model", ("graph", None, None), {}, "graph"),
        ("save_model", ("graph", "Both", out), {}, "graph"),
        ("convert_model", (MODEL, WEIGHTS, None, out), {}, "scale_offset_record_file"),
        ("convert_model", (MODEL, WEIGHTS, DATA, b"out"), {}, "save_path"),
        ("accuracy_based_auto_calibration", (MODEL, WEIGHTS, None, None, None, None), {}, "config_file"),
        ("export_onnx", (None, {}, out), {}, "graph"),
        ("fake_quant_graph", (None, {}), {}, "fused_gm"),
        ("fuse_bn", (None,), {}, "gm"),
        ("read_record", (None,), {}, "path"),
        ("write_record", (out + "_record.txt", ["conv1"]), {}, "records"),
        ("format_table", ("x",), {}, "stats"),
        ("format_table", ([],), dict(limit=1.5), "limit"),
        ("layer_report", (None, None, [], []), {}, "float_model"),
        ("caffe_test", (MODEL, WEIGHTS), dict(iterations=2.0), "iterations"),
        ("caffe_test", (MODEL, b"w.caffemodel"), {}, "weights_file"),
    ]


def call(name: str, args: tuple, kwargs: dict) -> Any:
    import amct_torch
    return getattr(amct_torch, name)(*args, **kwargs)
