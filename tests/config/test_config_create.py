"""create_quant_config and the model layer list: quantizability rules (docs/config_and_record.md) on a
hand-written prototxt, and the real nsfw ResNet checked against a count made with a regex."""
from __future__ import annotations

import json
import re

import pytest
from google.protobuf import text_format

from amct_torch.config import LayerInfo, create_quant_config, layer_infos_from_net, model_layer_infos
from amct_torch.errors import ConfigError, ModelError
from amct_torch.proto import amct_caffe_pb2
from helpers.configs import write

PROTOTXT = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "conv3d" type: "Convolution" bottom: "data" top: "conv3d" convolution_param { num_output: 4 kernel_size: 3 kernel_size: 3 kernel_size: 3 } }
layer { name: "deconv" type: "Deconvolution" bottom: "conv" top: "deconv" convolution_param { num_output: 2 kernel_size: 2 stride: 2 } }
layer { name: "deconv_dil" type: "Deconvolution" bottom: "conv" top: "deconv_dil" convolution_param { num_output: 2 kernel_size: 2 dilation: 2 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ave" type: "Pooling" bottom: "conv" top: "ave" pooling_param { pool: AVE kernel_size: 2 } }
layer { name: "gave" type: "Pooling" bottom: "conv" top: "gave" pooling_param { pool: AVE global_pooling: true } }
layer { name: "max" type: "Pooling" bottom: "conv" top: "max" pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "ave" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "fc_t" type: "InnerProduct" bottom: "ave" top: "fc_t" inner_product_param { num_output: 5 transpose: true } }
layer { name: "fc_ax" type: "InnerProduct" bottom: "ave" top: "fc_ax" inner_product_param { num_output: 5 axis: 2 } }
layer { name: "train_only" type: "InnerProduct" bottom: "ave" top: "t" include { phase: TRAIN } inner_product_param { num_output: 5 } }
"""

EXPECTED = [
    LayerInfo("data", "Input", False, False),
    LayerInfo("conv", "Convolution", True, True, 4),
    LayerInfo("conv3d", "Convolution", False, True, 4),
    LayerInfo("deconv", "Deconvolution", True, True, 2),
    LayerInfo("deconv_dil", "Deconvolution", False, True, 2),
    LayerInfo("relu", "ReLU", False, False),
    LayerInfo("ave", "Pooling", True, False),
    LayerInfo("gave", "Pooling", False, False),
    LayerInfo("max", "Pooling", False, False),
    LayerInfo("fc", "InnerProduct", True, True, 5),
    LayerInfo("fc_t", "InnerProduct", False, True, 5),
    LayerInfo("fc_ax", "InnerProduct", False, True, 5),
]


def test_layer_infos_from_net_follow_spec_constraints():
    net = amct_caffe_pb2.NetParameter()
    text_format.Parse(PROTOTXT, net)
    assert layer_infos_from_net(net) == EXPECTED


def test_layer_infos_from_v1_net():
    net = amct_caffe_pb2.NetParameter()
    text_format.Parse('layers { name: "c" type: CONVOLUTION convolution_param { num_output: 3 } } '
                      'layers { name: "r" type: RELU } '
                      'layers { name: "p" type: POOLING pooling_param { pool: AVE } }', net)
    assert layer_infos_from_net(net) == [LayerInfo("c", "Convolution", True, True, 3),
                                         LayerInfo("r", "RELU", False, False),
                                         LayerInfo("p", "Pooling", True, False)]


def _model(tmp_path):
    model = write(tmp_path, "deploy.prototxt", PROTOTXT)
    weights = write(tmp_path, "w.caffemodel", "")
    return model, weights


def test_create_quant_config_defaults(tmp_path):
    model, weights = _model(tmp_path)
    out = str(tmp_path / "q.json")
    create_quant_config(out, model, weights, skip_layers=["ave"], batch_num=3,
                        activation_offset=False)
    doc = json.load(open(out))
    assert list(doc)[6:] == ["ave", "conv", "deconv", "fc"]
    assert doc["batch_num"] == 3 and doc["activation_offset"] is False
    assert doc["ave"]["quant_enable"] is False and doc["conv"]["quant_enable"] is True
    assert doc["conv"]["activation_quant_params"]["asymmetric"] is False
    assert doc["conv"]["weight_quant_params"]["channel_wise"] is True
    assert doc["fc"]["weight_quant_params"]["channel_wise"] is False


def test_config_defination_wins_over_arguments(tmp_path):
    model, weights = _model(tmp_path)
    cfg = write(tmp_path, "quant.cfg", 'batch_num: 5 activation_offset: true skip_layers: "fc"')
    out = str(tmp_path / "q.json")
    create_quant_config(out, model, weights, skip_layers=["ave"], batch_num=3,
                        activation_offset=False, config_defination=cfg)
    doc = json.load(open(out))
    assert doc["batch_num"] == 5 and doc["activation_offset"] is True
    assert doc["ave"]["quant_enable"] is True and doc["fc"]["quant_enable"] is False


@pytest.mark.parametrize("kwargs,expect", [
    ({"skip_layers": ["relu"]}, "skip_layers: layer 'relu' (type ReLU) is not quantizable"),
    ({"skip_layers": ["gave"]}, "skip_layers: layer 'gave' (type Pooling) is not quantizable"),
    ({"skip_layers": ["nope"]}, "skip_layers: unknown layer 'nope'"),
    ({"skip_layers": "conv"}, "skip_layers must be a list of layer names, not a string"),
    ({"batch_num": 0}, "batch_num must be an integer >= 1, got 0"),
    ({"activation_offset": 1}, "activation_offset must be True or False, got 1"),
])
def test_argument_errors_name_the_model(tmp_path, kwargs, expect):
    model, weights = _model(tmp_path)
    with pytest.raises(ConfigError) as ei:
        create_quant_config(str(tmp_path / "q.json"), model, weights, **kwargs)
    assert ei.value.file == model and expect in str(ei.value)
    assert not (tmp_path / "q.json").exists()


def test_missing_weights_file(tmp_path):
    model, _ = _model(tmp_path)
    with pytest.raises(ModelError, match="weights file not found"):
        create_quant_config(str(tmp_path / "q.json"), model, str(tmp_path / "none.caffemodel"))


def test_nsfw_resnet_quantizable_layers_match_a_regex_count(tmp_path, nsfw_model):
    model, weights = nsfw_model
    text = open(model, encoding="utf-8").read()
    # Independent reference: every Convolution / InnerProduct layer, and the AVE pooling layers
    # without global_pooling, found with regexes on the raw prototxt.
    blocks = re.findall(r'layer\s*\{\s*name:\s*"([^"]+)"\s*type:\s*"(\w+)"(.*?)\n\}', text, re.S)
    expect = sorted(n for n, t, body in blocks
                    if t in ("Convolution", "InnerProduct")
                    or (t == "Pooling" and "pool: AVE" in body and "global_pooling: true" not in body))
    assert len(expect) == 55
    out = str(tmp_path / "q.json")
    create_quant_config(out, model, weights)
    doc = json.load(open(out))
    assert list(doc)[6:] == expect
    infos = {i.name: i for i in model_layer_infos(model)}
    assert infos["fc_nsfw"] == LayerInfo("fc_nsfw", "InnerProduct", True, True, 2)
