"""A job's batch plan (``amct_torch.inputs.plan_batches``): which rows calibrate, which are held
out for the per-layer report and the improvements' guard, what it says about the rows it did
not use, and the checks it makes before the first batch. References: the rows of the array
given, sliced by hand."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.errors import DataError, ModelError
from amct_torch.inputs import plan_batches
from amct_torch.inputs.batching import Keep, held_out_batches, report_use
from amct_torch.workflow.examples import example_data, example_model


@pytest.fixture(scope="module")
def example():
    model, weights = example_model()
    x, _ = example_data("calib")
    return model, load_caffe(model, weights), x


def _rows(batches) -> np.ndarray:
    return np.concatenate([b.numpy() for b in batches])


def test_the_default_batch_size_spreads_every_sample_over_the_batches(example, caplog):
    model, gm, x = example
    plan = plan_batches(gm, x[:10], model_file=model, device="cpu")
    with caplog.at_level(logging.INFO, logger="amct_torch"):
        it = iter(plan.calibration_batches(3))
        calibrated = [next(it) for _ in range(3)]
        plan.calibrated(it)
    assert plan.batch_size == 4 and plan.count == 10 and plan.samples == 10  # 4 + 4 + 2
    np.testing.assert_array_equal(_rows(calibrated), x[:10])
    assert "calibrated on all 10 samples" in caplog.text


def test_the_report_reads_the_batches_after_the_calibration_ones(example):
    model, gm, x = example
    plan = plan_batches(gm, x[:14], model_file=model, device="cpu", batch_size=4, report_batches=2)
    it = iter(plan.calibration_batches(2))
    calibrated = [next(it) for _ in range(2)]
    plan.calibrated(it)
    held, held_out = plan.report_batches()
    assert held_out and [len(b) for b in held] == [4, 2]
    np.testing.assert_array_equal(_rows(held), x[8:14])
    np.testing.assert_array_equal(_rows(plan.cache), _rows(calibrated))  # the report's fallback, kept


def test_without_rows_left_the_report_reads_the_first_calibration_batches(example):
    model, gm, x = example
    plan = plan_batches(gm, x[:8], model_file=model, device="cpu", batch_size=4, report_batches=1)
    it = iter(plan.calibration_batches(2))
    [next(it) for _ in range(2)]
    plan.calibrated(it)
    held, held_out = plan.report_batches()
    assert not held_out
    np.testing.assert_array_equal(_rows(held), x[:4])


def test_the_guard_and_the_report_read_the_same_held_out_rows(example):
    model, gm, x = example
    plan = plan_batches(gm, x[:120], model_file=model, device="cpu", batch_size=20, report_batches=1,
                        guard=True, keep_all=True)
    it = iter(plan.calibration_batches(2))
    [next(it) for _ in range(2)]
    plan.calibrated(it)
    assert len(plan.cache) == 2  # keep_all: every calibration batch
    guard = plan.guard_batches()  # 64 rows: 4 batches of 20
    np.testing.assert_array_equal(_rows(guard), x[40:120])
    held, held_out = plan.report_batches()
    np.testing.assert_array_equal(_rows(held), x[40:60])
    assert held_out


def test_the_memory_check_comes_before_the_first_batch(example, monkeypatch):
    from amct_torch.caffe import memory
    model, gm, x = example
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (1000, "given"))
    read = []

    def batches():
        read.append(1)
        yield torch.from_numpy(x[:4])
    plan = plan_batches(gm, batches(), model_file=model, device="cpu", batch_size=4)
    with pytest.raises(ModelError) as err:
        plan.calibration_batches(1)
    assert err.value.file == model and read == []


def test_no_data_and_no_data_layer_names_the_model(example):
    model, gm, _ = example
    with pytest.raises(DataError, match="no data layer in the TEST phase") as err:
        plan_batches(gm, None, model_file=model, device="cpu")
    assert err.value.file == model


def test_the_unused_warning_does_not_count_the_held_out_rows(caplog):
    keep = Keep()
    list(keep((torch.zeros(4, 1, 2, 2) for _ in range(2)), 2))  # 8 samples calibrated
    with caplog.at_level(logging.INFO, logger="amct_torch"):
        report_use(keep, 16, 2, 4, held_batches=2)  # the other 8: the report's two batches
    assert "unused" not in caplog.text and "held out for the per-layer report" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="amct_torch"):
        report_use(keep, 20, 2, 4, held_batches=2)
    assert "4 sample(s) unused" in caplog.text and "8 more held out" in caplog.text


def test_held_out_batches_are_read_again_by_the_report():
    batches = iter([torch.full((8, 1), float(i)) for i in range(12)])
    taken, rest = held_out_batches(batches, 2)
    assert len(taken) == 8                            # 64 rows: 8 batches of 8
    again = list(rest)
    assert [float(b[0, 0]) for b in again] == list(range(12))   # the same batches first, then the rest
    taken, rest = held_out_batches(iter([torch.zeros(40, 1)] * 3), 2)
    assert len(taken) == 2                            # the report's 2 batches already hold 64 rows
    taken, _ = held_out_batches(iter([torch.zeros(8, 1)] * 3), 0)
    assert len(taken) == 3                            # fewer rows than wanted: all there are


def test_the_first_batchs_real_shape_is_checked_and_names_the_model(example, monkeypatch):
    """The declared 16x16 input fits; the first batch, 700x700 per sample, does not: refused
    (naming the model file, which the memory check itself is not given) before it is passed on."""
    from amct_torch.caffe import memory
    model, gm, x = example
    per = memory.estimate_activation_memory(gm).bytes_at(1)
    monkeypatch.setattr(memory, "available_memory", lambda device=None: (int(per * 8), "given"))
    plan = plan_batches(gm, iter([torch.zeros(2, 1, 700, 700)]), model_file=model, device="cpu", batch_size=2)
    batches = iter(plan.calibration_batches(1))
    with pytest.raises(ModelError, match="after preprocessing") as err:
        next(batches)
    assert err.value.file == model and err.value.layer is not None


def test_a_resize_beyond_the_pixel_budget_names_the_model(example, tmp_path):
    import cv2

    from amct_torch.inputs import Preprocess
    model, gm, _ = example
    ok, png = cv2.imencode(".png", np.zeros((16, 16), dtype=np.uint8))
    (tmp_path / "im0.png").write_bytes(png.tobytes())
    plan = plan_batches(gm, str(tmp_path), model_file=model, device="cpu", preprocess=Preprocess(resize=100000))
    with pytest.raises(DataError, match="would be resized to 100000x100000") as err:
        plan.calibration_batches(1)
    assert err.value.file == model
