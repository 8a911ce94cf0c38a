"""The one-call API on the bundled example: data as an iterable of batches or a file path,
the documented files under the prefix, and nothing written when the data is bad."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import amct_torch
from amct_torch import DataError
from amct_torch.workflow.examples import example_data, example_model


def test_iterable_batches_and_path_give_the_same_record(tmp_path):
    proto, weights = example_model()
    x, _ = example_data("calib")
    batches = [torch.from_numpy(x[i:i + 20]) for i in range(0, 60, 20)]
    a = amct_torch.quantize(proto, weights, batches, output=str(tmp_path / "a" / "m"), batch_num=3,
                            save_type=None, report=False, quiet=True)
    np.save(tmp_path / "calib.npy", x[:60])
    b = amct_torch.quantize(proto, weights, str(tmp_path / "calib.npy"), output=str(tmp_path / "b" / "m"),
                            batch_num=3, batch_size=20, save_type="Fakequant", report=True, quiet=True)
    assert a.records == b.records
    assert sorted(os.listdir(tmp_path / "a")) == ["m_quant_config.json", "m_record.txt"]
    assert os.path.isfile(b.files["fake_quant_model"]) and os.path.isfile(b.files["report"])
    assert not os.path.exists(str(tmp_path / "b" / "m_deploy_model.prototxt"))
    # the report has every quantized layer
    assert {s.layer for s in b.report} == set(b.records)


def test_bad_data_leaves_no_output(tmp_path):
    proto, weights = example_model()
    bad = [np.zeros((4, 3, 16, 16), np.float32)]
    with pytest.raises(DataError):
        amct_torch.quantize(proto, weights, bad, output=str(tmp_path / "out" / "m"), quiet=True)
    assert not os.path.exists(tmp_path / "out")
    x, _ = example_data("calib")
    with pytest.raises(DataError) as err:   # fewer batches than batch_num
        amct_torch.quantize(proto, weights, [torch.from_numpy(x[:8])], batch_num=2,
                            output=str(tmp_path / "out" / "m"), quiet=True)
    assert "batch_num" in str(err.value)
    assert not os.path.exists(tmp_path / "out")
