"""Every validation rule of docs/config_and_record.md ("Record"), each with its exact error (layer and file named)."""
from __future__ import annotations

import math
import os

import pytest

from amct_torch.config import LayerInfo
from amct_torch.errors import RecordError
from amct_torch.record import LayerRecord, read_record, validate_record
from helpers.configs import DATA, LAYERS

PATH = "/x/record.txt"


def good() -> dict:
    return {"conv1": LayerRecord(0.1, -3, [0.5] * 8, [0] * 8, [], 3, 16, 16),
            "conv2": LayerRecord(0.2, 0, [0.5], [0], [0], 8, 8, 8),
            "pool1": LayerRecord(0.3, 127, channels=8, height=8, width=8),
            "fc1": LayerRecord(0.4, -128, [0.25], [0], channels=64, height=1, width=1)}


def err(records: dict, layers=LAYERS) -> RecordError:
    with pytest.raises(RecordError) as ei:
        validate_record(records, layers, PATH)
    return ei.value


def test_valid_record_passes():
    validate_record(good(), LAYERS, PATH)


def test_pool_with_neutral_weight_factors_is_tolerated():
    r = good()
    r["pool1"].scale_w, r["pool1"].offset_w = [1.0], [0]
    validate_record(r, LAYERS, PATH)


def test_seed_record_refused_for_shift_bit_naming_layer_and_file():
    path = os.path.join(DATA, "seed000_record.txt")
    layers = [LayerInfo("conv1", "Convolution", True, True, 3), LayerInfo("pool1", "Pooling", True, False),
              LayerInfo("fc1", "InnerProduct", True, True, 10)]
    with pytest.raises(RecordError) as ei:
        validate_record(read_record(path), layers, path)
    assert ei.value.file == path and ei.value.layer == "conv1"
    assert str(ei.value) == (f"{path}, layer 'conv1': shift_bit [1, 1, 1] is not supported (non-zero "
                             "shift): edit the record entry of layer 'conv1' to remove its shift_bit "
                             "lines or set them to 0")


def test_seed_record_with_shift_bits_zeroed_is_valid(tmp_path):
    text = open(os.path.join(DATA, "seed000_record.txt"), encoding="utf-8").read()
    path = tmp_path / "r.txt"
    path.write_text(text.replace("shift_bit: 1", "shift_bit: 0"))
    layers = [LayerInfo("conv1", "Convolution", True, True, 3), LayerInfo("pool1", "Pooling", True, False),
              LayerInfo("fc1", "InnerProduct", True, True, 10)]
    validate_record(read_record(str(path)), layers, str(path))


def test_empty_record():
    e = err({})
    assert (e.layer, str(e)) == (None, f"{PATH}: the record is empty: no layer has quantization factors")


def _one(name: str, **changes) -> RecordError:
    r = good()
    for k, v in changes.items():
        setattr(r[name], k, v)
    return err(r)


@pytest.mark.parametrize("name,changes,expect", [
    ("conv1", {"scale_d": None}, "scale_d missing: every record entry needs activation factors"),
    ("conv1", {"offset_d": None}, "offset_d missing: every record entry needs activation factors"),
    ("pool1", {"scale_d": None, "offset_d": None},
     "scale_d and offset_d missing: every record entry needs activation factors"),
    ("conv1", {"scale_d": 0.0}, "scale_d must be finite and > 0, got 0.0"),
    ("conv1", {"scale_d": -1.0}, "scale_d must be finite and > 0, got -1.0"),
    ("conv1", {"scale_d": math.inf}, "scale_d must be finite and > 0, got inf"),
    ("conv1", {"scale_d": math.nan}, "scale_d must be finite and > 0, got nan"),
    ("fc1", {"offset_d": 128}, "offset_d must be in [-128, 127], got 128"),
    ("fc1", {"offset_d": -129}, "offset_d must be in [-128, 127], got -129"),
    ("conv2", {"shift_bit": [0, 2]}, "shift_bit [0, 2] is not supported (non-zero shift): edit the "
     "record entry of layer 'conv2' to remove its shift_bit lines or set them to 0"),
    ("conv1", {"scale_w": [], "offset_w": []}, "scale_w and offset_w are required for a layer with "
     "weights (Convolution); got 0 scale_w and 0 offset_w"),
    ("fc1", {"offset_w": []}, "scale_w and offset_w are required for a layer with weights "
     "(InnerProduct); got 1 scale_w and 0 offset_w"),
    ("conv1", {"offset_w": [0] * 7}, "scale_w has 8 values but offset_w has 7: they must have the "
     "same length"),
    ("conv1", {"scale_w": [0.5] * 3, "offset_w": [0] * 3}, "scale_w has 3 values; expected 1 (per "
     "tensor) or 8 (one per output channel)"),
    ("fc1", {"scale_w": [0.5] * 10, "offset_w": [0] * 10}, "InnerProduct weights are quantized per "
     "tensor: expected 1 scale_w, got 10"),
    ("pool1", {"scale_w": [0.5], "offset_w": [0]}, "Pooling has no weights: scale_w/offset_w must "
     "be absent (got scale_w [0.5], offset_w [0])"),
    ("pool1", {"scale_w": [1.0]}, "Pooling has no weights: scale_w/offset_w must be absent (got "
     "scale_w [1.0], offset_w [])"),
    ("conv2", {"scale_w": [0.0]}, "scale_w must be finite and > 0, got 0.0"),
    ("conv2", {"scale_w": [math.inf]}, "scale_w must be finite and > 0, got inf"),
    ("conv2", {"offset_w": [1]}, "offset_w must be all 0 (weights are quantized symmetrically), "
     "got [1]"),
])
def test_rules(name, changes, expect):
    e = _one(name, **changes)
    assert (e.file, e.layer) == (PATH, name)
    assert str(e) == f"{PATH}, layer '{name}': {expect}"


def test_key_not_in_model():
    r = good()
    r["conv9"] = LayerRecord(0.1, 0)
    e = err(r)
    assert str(e) == (f"{PATH}, layer 'conv9': layer not found in the model: remove this record "
                      "entry or fix its key")


@pytest.mark.parametrize("name,ltype", [("relu1", "ReLU"), ("pool2", "Pooling")])
def test_key_not_quantizable(name, ltype):
    r = good()
    r[name] = LayerRecord(0.1, 0)
    e = err(r)
    assert str(e) == (f"{PATH}, layer '{name}': layer type {ltype} is not quantizable here "
                      "(quantizable: Convolution, Deconvolution, InnerProduct, AVE non-global "
                      "Pooling, and Eltwise with joint_quant); remove its record entry")


def test_joint_quant_eltwise_entry_accepted_with_activation_factors_only():
    layers = LAYERS + [LayerInfo("add1", "Eltwise", False, False)]
    r = good()
    r["add1"] = LayerRecord(0.05, -10, channels=8, height=8, width=8)
    validate_record(r, layers, PATH)
    r["add1"] = LayerRecord(0.05, -10, [1.0], [0])
    e = err(r, layers)
    assert e.layer == "add1" and "only scale_d/offset_d" in str(e)


def test_per_tensor_allowed_when_out_channels_unknown():
    layers = [LayerInfo("c", "Convolution", True, True, None)]
    validate_record({"c": LayerRecord(0.1, 0, [0.5], [0])}, layers, PATH)
    e = err({"c": LayerRecord(0.1, 0, [0.5, 0.5], [0, 0])}, layers)
    assert "expected 1 (per tensor) or its output channel count is unknown" in str(e)
