"""The steps work in memory: load -> fuse + ARQ -> calibrate -> finish writes no file, gives the
record AMCT's file-based calls write for the same batches, and the record check refuses what
is missing, naming the layer."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from amct_torch import CalibrationError, RecordError, create_quant_config, init, quantize_model
from amct_torch.record import read_record
from amct_torch.steps import check_records, finish_calibration, load, quantize_weights, start_calibration
from amct_torch.workflow.examples import example_data, example_model

_WRITES: list = []
_ON = [False]


#: what the steps could write: a record, a config, a model (the CPU kernels' build cache, which
#: a first calibration on a machine may fill, is not an output)
_OUTPUTS = (".txt", ".json", ".prototxt", ".caffemodel", ".onnx")


def _hook(event: str, args: tuple) -> None:
    # an output file renamed into place (atomic writes), or opened for writing by a file object
    # (mode with w/a/x/+) or by os.open (flags)
    if _ON[0] and event == "os.rename" and isinstance(args[1], str) and args[1].endswith(_OUTPUTS):
        _WRITES.append(args[1])
    if _ON[0] and event == "open" and isinstance(args[0], str) and args[0].endswith(_OUTPUTS):
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and set(mode) & set("wax+")) or \
                (mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
            _WRITES.append(args[0])


sys.addaudithook(_hook)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    proto, weights = example_model()
    cfg = str(tmp / "c.json")
    create_quant_config(cfg, proto, weights, batch_num=2)
    x, _ = example_data("calib")
    return tmp, proto, weights, cfg, [torch.from_numpy(x[i:i + 20]) for i in (0, 20)]


def test_steps_write_nothing_and_match_amct_calls(setup):
    tmp, proto, weights, cfg, batches = setup
    _WRITES.clear()
    _ON[0] = True
    try:
        graph = load(cfg, proto, weights)
        weight_part = dict(quantize_weights(graph))
        start_calibration(graph)
        with torch.no_grad():
            for b in batches:
                graph.fused(b)
        records = check_records(graph, finish_calibration(graph), None)
    finally:
        _ON[0] = False
    assert _WRITES == []
    assert all(r.scale_d is None and r.scale_w for r in weight_part.values())

    rec = str(tmp / "r.txt")
    g2 = init(cfg, proto, weights, rec)
    model = quantize_model(g2, None, None)
    with torch.no_grad():
        for b in batches:
            model(b)
    assert records == read_record(rec)
    assert list(records) == list(read_record(rec))
    # the steps keep each observer's summary for a report; the file-based calls, which write
    # none, keep none (and get the same record)
    assert set(graph.session.summaries) == set(records)
    assert g2.session.summaries == {}


def test_finish_before_start_and_missing_factors_are_refused(setup):
    _tmp, proto, weights, cfg, batches = setup
    graph = load(cfg, proto, weights)
    with pytest.raises(CalibrationError, match="not started"):
        finish_calibration(graph)
    quantize_weights(graph)
    start_calibration(graph)
    with torch.no_grad():
        graph.fused(batches[0])          # one of batch_num=2: the calibration is not finished
    with pytest.raises(RecordError) as err:
        check_records(graph, graph.records, None)
    assert err.value.file is None and err.value.layer in graph.quant_layers
    assert "ran 1" in str(err.value)
