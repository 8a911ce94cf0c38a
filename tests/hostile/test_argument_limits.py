"""Arguments that used to end in a traceback: an absurd ``--batch-num`` (CLI and API), negative
``--report-batches``/``--report-rows`` and ``evaluate`` counts are argument errors (exit 2, one
line); ``evaluate --reference`` with a model whose output has another shape names the output
and both shapes."""
from __future__ import annotations

import os

import numpy as np
import pytest

import amct_torch
from amct_torch.cli import main
from amct_torch.errors import AmctError, ModelError
from amct_torch.inputs.limits import MAX_BATCH_NUM
from amct_torch.quality.evaluate import evaluate
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model
from helpers.caffe_nets import make_net
from helpers.exports import SMALL_BODY, small_blobs

DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")


def _calibrate(tmp_path, *extra: str) -> list[str]:
    model, weights = example_model()
    return ["calibrate", model, weights, DATA, "--device", "cpu", "-q", "--report-batches", "0",
            "-o", str(tmp_path / "out" / "m"), *extra]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv", [["--report-batches", "-1"], ["--report-rows", "-1"], ["--batch-num", "0"]])
def test_calibrate_refuses_the_argument_with_one_line(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(_calibrate(tmp_path, *argv))
    assert stop.value.code == 2
    line = _one_line(capsys)
    assert argv[0] in line and "Traceback" not in line
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("value", ["1000000000000000", str(MAX_BATCH_NUM + 1)])
def test_calibrate_refuses_an_absurd_batch_num_naming_the_data(tmp_path, capsys, value):
    # refused before the model is read: the count overflowed the config's 32-bit field
    assert main(_calibrate(tmp_path, "--batch-num", value)) == 2
    line = _one_line(capsys)
    assert DATA in line and "--batch-num" in line and str(MAX_BATCH_NUM) in line
    assert not os.path.exists(tmp_path / "out")


def test_config_and_demo_refuse_an_absurd_batch_num(tmp_path, capsys):
    model, weights = example_model()
    for argv in (["config", model, weights, "-o", str(tmp_path / "c.json"), "--batch-num", "10000000000"],
                 ["demo", "-o", str(tmp_path / "d" / "m"), "--batch-num", "10000000000"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        assert "--batch-num" in _one_line(capsys)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", [10 ** 15, MAX_BATCH_NUM + 1, 2.5, "many"])
def test_api_refuses_an_absurd_batch_num_before_any_work(tmp_path, value):
    model, weights = example_model()
    with pytest.raises(AmctError, match="batch_num"):
        amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "out" / "m"), device="cpu",
                            quiet=True, batch_num=value)
    assert not os.path.exists(tmp_path / "out")


def test_report_rows_zero_and_batches_zero_are_accepted(tmp_path, capsys):
    assert main(_calibrate(tmp_path, "--batch-num", "1", "--report-rows", "0")) == 0
    assert not os.path.exists(tmp_path / "out" / "m_layer_report.json")


def _two_nets(tmp_path, other_fc: int):
    rng = np.random.default_rng(0)
    a = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(rng), name="a")
    blobs = small_blobs(np.random.default_rng(0))
    blobs["fc1"] = [np.zeros((other_fc, 64), np.float32), np.zeros(other_fc, np.float32)]
    body = SMALL_BODY.replace("num_output: 5", f"num_output: {other_fc}")
    b = make_net(tmp_path, body, {"data": [1, 3, 8, 8]}, blobs, name="b")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32))
    return a, b, str(tmp_path / "x.npy")


def test_evaluate_reference_with_another_output_shape_names_the_output_and_both_shapes(tmp_path, capsys):
    a, b, data = _two_nets(tmp_path, 6)
    with pytest.raises(ModelError) as err:
        evaluate(*a, data, b, batch_size=2)
    msg = str(err.value)
    assert "'fc1'" in msg and "[2, 5]" in msg and "[2, 6]" in msg and a[0] in msg and b[0] in msg
    assert main(["evaluate", *a, data, "--reference", *b, "--batch-size", "2"]) == 2
    line = _one_line(capsys)
    assert "'fc1'" in line and "[2, 5]" in line and "[2, 6]" in line


@pytest.mark.parametrize("argv", [["--batch-size", "-1"], ["--max-batches", "-1"], ["--max-batches", "0"],
                                  ["--mean", "abc"]])
def test_evaluate_refuses_bad_counts_with_one_line(tmp_path, capsys, argv):
    a, _, data = _two_nets(tmp_path, 5)
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", *a, data, *argv])
    assert stop.value.code == 2
    assert argv[0] in _one_line(capsys)


def test_only_outputs_behind_a_data_dependent_layer_may_differ_in_shape(tmp_path):
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.quality.evaluate import data_dependent_outputs
    from helpers.ssd import ssd_net
    ssd = load_caffe(*ssd_net(tmp_path))
    assert data_dependent_outputs(ssd) == {"detection_out"}
    a, _, _ = _two_nets(tmp_path, 5)
    assert data_dependent_outputs(load_caffe(*a)) == set()
