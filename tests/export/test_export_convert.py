"""convert_model on seed 000's example record (a model with conv1/pool1/fc1 built here)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from amct_torch.errors import ModelError, RecordError
from amct_torch.export import convert_model
from helpers.caffe_nets import make_net

SEED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "seed000_record.txt")
# conv1 takes 3 channels, 3 outputs; pool1 AVE; fc1 (one output per tensor scale)
BODY = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 3 kernel_size: 3 pad: 1 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool1" top: "fc1" inner_product_param { num_output: 2 } }
'''


def _model(folder):
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    blobs = {"conv1": [f(3, 3, 3, 3), f(3)], "bn1": [f(3), np.abs(f(3)) + 1, np.ones(1, np.float32)],
             "sc1": [f(3), f(3)], "fc1": [f(2, 48), f(2)]}  # fc1 large enough for the seed's scale_w
    return make_net(folder, BODY, {"data": [1, 3, 8, 8]}, blobs)


def test_seed_record_shift_bit_is_refused(tmp_path):
    proto, model = _model(tmp_path)
    with pytest.raises(RecordError, match="shift_bit") as err:
        convert_model(proto, model, SEED, str(tmp_path / "out"))
    assert err.value.layer == "conv1" and err.value.file == SEED


def test_corrected_seed_record_converts(tmp_path):
    proto, model = _model(tmp_path)
    rec = tmp_path / "record.txt"
    rec.write_text(open(SEED).read().replace("shift_bit: 1", "shift_bit: 0"))
    paths = convert_model(proto, model, str(rec), str(tmp_path / "out"))
    assert len(paths) == 5 and all(os.path.exists(p) for p in paths)
    info = json.load(open(tmp_path / "out_quant.json"))
    assert sorted(q["quantized_layers"][0] for q in info["quant_layers"]) == ["conv1", "fc1", "pool1"]
    # conv1's record says skip_fusion: its BN and Scale stay in the models
    assert info["fused_layers"] == {}
    text = open(tmp_path / "out_fake_quant_model.prototxt").read()
    assert 'name: "bn1"' in text and 'type: "Quant"' in text
    # without skip_fusion the BN+Scale are folded into conv1 and listed in the quant info
    rec.write_text(rec.read_text().replace("skip_fusion: true", ""))
    convert_model(proto, model, str(rec), str(tmp_path / "out2"))
    info2 = json.load(open(tmp_path / "out2_quant.json"))
    assert info2["fused_layers"] == {"conv1": ["conv1", "bn1", "sc1"]}
    assert 'name: "bn1"' not in open(tmp_path / "out2_fake_quant_model.prototxt").read()


def test_quantized_models_are_refused(tmp_path):
    proto, model = _model(tmp_path)
    rec = tmp_path / "record.txt"
    rec.write_text(open(SEED).read().replace("shift_bit: 1", "shift_bit: 0"))
    convert_model(proto, model, str(rec), str(tmp_path / "out"))
    with pytest.raises(ModelError, match="Quant") as err:
        convert_model(str(tmp_path / "out_fake_quant_model.prototxt"),
                      str(tmp_path / "out_fake_quant_weights.caffemodel"), str(rec), str(tmp_path / "x"))
    assert err.value.layer == "conv1_quant_layer"
    # a float prototxt with a deploy (int8) caffemodel
    shutil.copy(tmp_path / "out_deploy_weights.caffemodel", tmp_path / "int8.caffemodel")
    with pytest.raises(ModelError, match="int8") as err:
        convert_model(proto, str(tmp_path / "int8.caffemodel"), str(rec), str(tmp_path / "y"))
    assert err.value.file.endswith("int8.caffemodel")
