"""quantize_model(graph, None, None): no modified model written, and the calibration gives the
same record as with the files written."""
from __future__ import annotations

import os

import torch

from amct_torch import create_quant_config, init, quantize_model
from amct_torch.workflow.examples import example_data, example_model


def _record(tmp, write: bool) -> str:
    proto, weights = example_model()
    x, _ = example_data("calib")
    os.makedirs(tmp, exist_ok=True)
    create_quant_config(os.path.join(tmp, "c.json"), proto, weights, batch_num=2)
    graph = init(os.path.join(tmp, "c.json"), proto, weights, os.path.join(tmp, "r.txt"))
    files = (os.path.join(tmp, "m.prototxt"), os.path.join(tmp, "m.caffemodel")) if write else (None, None)
    model = quantize_model(graph, *files)
    with torch.no_grad():
        for i in range(2):
            model(torch.from_numpy(x[20 * i:20 * i + 20]))
    assert os.path.exists(os.path.join(tmp, "m.caffemodel")) == write
    return open(os.path.join(tmp, "r.txt")).read()


def test_no_modified_model_and_the_same_record(tmp_path):
    assert _record(str(tmp_path / "a"), False) == _record(str(tmp_path / "b"), True)
    assert sorted(os.listdir(tmp_path / "a")) == ["c.json", "r.txt"]
