"""The JSON quant config (docs/config_and_record.md): its exact form, round trips from quant.cfg, and the
reader's validation (duplicate keys, unknown layers/parameters, wrong types, ranges)."""
from __future__ import annotations

import json

import pytest

from amct_torch.config import (
    LayerQuantConfig,
    QuantConfig,
    parse_quant_cfg,
    read_quant_config_json,
    resolve_quant_cfg,
    write_quant_config_json,
)
from amct_torch.config.json_config import quant_config_to_json
from amct_torch.errors import ConfigError
from helpers.configs import LAYERS, write

IFMR_LAYER = {"quant_enable": True,
              "activation_quant_params": {"num_bits": 8, "act_algo": "ifmr",
                                          "max_percentile": 0.999999, "min_percentile": 0.999999,
                                          "search_range": [0.7, 1.3], "search_step": 0.01,
                                          "asymmetric": True},
              "weight_quant_params": {"num_bits": 8, "wts_algo": "arq_quantize",
                                      "channel_wise": True}}


def test_written_form_matches_spec(tmp_path):
    path = write(tmp_path, "q.cfg", 'skip_layers: "pool1" override_layer_configs { layer_name: "fc1" '
                                    'calibration_config { hfmg_quantize { num_of_bins: 2048 } } }')
    qc = resolve_quant_cfg(parse_quant_cfg(path), LAYERS, path)
    out = str(tmp_path / "q.json")
    write_quant_config_json(out, qc)
    raw = open(out, encoding="utf-8").read()
    doc = json.loads(raw)
    assert list(doc) == ["version", "batch_num", "activation_offset", "joint_quant", "do_fusion",
                         "skip_fusion_layers", "conv1", "conv2", "deconv1", "fc1", "pool1"]
    assert [doc[k] for k in list(doc)[:6]] == [1, 1, True, False, True, []]
    assert doc["conv1"] == IFMR_LAYER                              # the docs' example object
    assert list(doc["conv1"]["activation_quant_params"]) == \
        ["num_bits", "act_algo", "max_percentile", "min_percentile", "search_range",
         "search_step", "asymmetric"]
    assert doc["fc1"]["activation_quant_params"] == {"num_bits": 8, "act_algo": "hfmg",
                                                     "num_of_bins": 2048, "asymmetric": True}
    assert doc["fc1"]["weight_quant_params"]["channel_wise"] is False
    assert doc["pool1"]["quant_enable"] is False
    assert '"max_percentile": 0.999999,' in raw                    # float32 shown as written


def test_round_trip_cfg_json_gives_same_layer_configs(tmp_path):
    path = write(tmp_path, "q.cfg", """
        batch_num: 4 activation_offset: false joint_quant: true do_fusion: false
        skip_fusion_layers: "conv2" skip_layers: "deconv1"
        common_config { arq_quantize { channel_wise: false }
                        ifmr_quantize { search_range_start: 0.61 search_range_end: 1.37 search_step: 0.013
                                        max_percentile: 0.9999 min_percentile: 0.99 } }
        override_layer_types { layer_type: "Pooling" calibration_config { hfmg_quantize { num_of_bins: 8192 asymmetric: true } } }
        override_layer_configs { layer_name: "conv1" calibration_config { ifmr_quantize { asymmetric: true search_step: 0.3 } } }""")
    qc = resolve_quant_cfg(parse_quant_cfg(path), LAYERS, path)
    out = str(tmp_path / "q.json")
    write_quant_config_json(out, qc)
    back = read_quant_config_json(out, LAYERS)
    assert back == qc
    assert back.layers["conv2"].search_range == (0.61, 1.37) and back.layers["conv2"].search_step == 0.013
    assert back.layers["pool1"].num_of_bins == 8192 and back.layers["pool1"].asymmetric


def test_missing_params_take_defaults_and_missing_layers_are_not_quantized(tmp_path):
    path = write(tmp_path, "q.json", json.dumps({"activation_offset": False, "conv1": {}}))
    qc = read_quant_config_json(path, LAYERS)
    assert qc.layers["conv1"] == LayerQuantConfig(asymmetric=False, channel_wise=True)
    assert qc.enabled_layers() == ["conv1"]
    assert qc.layers["fc1"].quant_enable is False and qc.layers["fc1"].channel_wise is False


def _doc(**layers) -> dict:
    d = {"version": 1, "batch_num": 1, "activation_offset": True, "joint_quant": False,
         "do_fusion": True, "skip_fusion_layers": []}
    d.update({"conv1": json.loads(json.dumps(IFMR_LAYER))})
    d.update(layers)
    return d


def _err(tmp_path, text: str) -> tuple[ConfigError, str]:
    path = write(tmp_path, "q.json", text)
    with pytest.raises(ConfigError) as ei:
        read_quant_config_json(path, LAYERS)
    return ei.value, path


def _with(path_keys: list, value) -> str:
    d = _doc()
    node = d
    for k in path_keys[:-1]:
        node = node[k]
    node[path_keys[-1]] = value
    return json.dumps(d)


def test_duplicate_top_level_key(tmp_path):
    text = json.dumps(_doc())[:-1] + ', "batch_num": 2}'
    e, path = _err(tmp_path, text)
    assert str(e) == f"{path}: duplicate key 'batch_num' in the top level"


def test_duplicate_key_inside_layer_names_layer(tmp_path):
    text = json.dumps(_doc()).replace('"search_step": 0.01', '"search_step": 0.01, "search_step": 0.02')
    e, path = _err(tmp_path, text)
    assert str(e) == f"{path}, layer 'conv1': duplicate key 'search_step' in activation_quant_params"


def test_duplicate_layer_object(tmp_path):
    text = json.dumps(_doc())[:-1] + ', "conv1": {}}'
    e, path = _err(tmp_path, text)
    assert str(e) == f"{path}: duplicate key 'conv1' in the top level"


@pytest.mark.parametrize("key,expect,layer", [
    ("nope", "unknown layer or parameter 'nope': the model has no layer of that name and it is "
     "not one of the global keys (version, batch_num, activation_offset, joint_quant, do_fusion, "
     "skip_fusion_layers)", "nope"),
    ("relu1", "layer 'relu1' (type ReLU) is not quantizable", "relu1"),
    ("pool2", "layer 'pool2' (type Pooling) is not quantizable", "pool2"),
])
def test_unknown_or_unquantizable_layer(tmp_path, key, expect, layer):
    e, path = _err(tmp_path, json.dumps(_doc(**{key: {}})))
    assert (e.layer, str(e)) == (layer, f"{path}, layer '{layer}': {expect}")


@pytest.mark.parametrize("keys,value,expect", [
    (["conv1", "extra"], 1, "unknown parameter 'extra' in the layer object (allowed: quant_enable, "
     "activation_quant_params, weight_quant_params)"),
    (["conv1", "activation_quant_params", "num_of_bins"], 4096,
     "unknown parameter 'num_of_bins' in activation_quant_params (ifmr) (allowed: num_bits, act_algo, "
     "asymmetric, max_percentile, min_percentile, search_range, search_step)"),
    (["conv1", "weight_quant_params", "symmetric"], True,
     "unknown parameter 'symmetric' in weight_quant_params (allowed: num_bits, wts_algo, channel_wise)"),
    (["conv1", "quant_enable"], 1, "quant_enable must be true or false, got 1"),
    (["conv1", "activation_quant_params", "asymmetric"], "yes",
     "activation_quant_params.asymmetric must be true or false, got \"yes\""),
    (["conv1", "activation_quant_params", "search_step"], "0.01",
     "activation_quant_params.search_step must be a finite number, got \"0.01\""),
    (["conv1", "activation_quant_params", "max_percentile"], True,
     "activation_quant_params.max_percentile must be a finite number, got true"),
    (["conv1", "activation_quant_params", "max_percentile"], 0.5,
     "activation_quant_params.max_percentile must be in (0.5, 1], got 0.5"),
    (["conv1", "activation_quant_params", "min_percentile"], 1.5,
     "activation_quant_params.min_percentile must be in (0.5, 1], got 1.5"),
    (["conv1", "activation_quant_params", "search_range"], [1.3, 0.7],
     "activation_quant_params.search range must satisfy 0 < search_range_start < search_range_end, "
     "got start 1.3, end 0.7"),
    (["conv1", "activation_quant_params", "search_range"], [0.7],
     "activation_quant_params.search_range must be a list of two numbers [start, end], got [0.7]"),
    (["conv1", "activation_quant_params", "search_step"], 0.7,
     "activation_quant_params.search_step must satisfy 0 < search_step <= search_range_end - "
     "search_range_start = 0.6000000000000001, got 0.7"),
    (["conv1", "activation_quant_params", "act_algo"], "kl",
     "activation_quant_params.act_algo must be one of ifmr, hfmg, got \"kl\""),
    (["conv1", "activation_quant_params", "num_bits"], 16,
     "activation_quant_params.num_bits must be 8, got 16"),
    (["conv1", "weight_quant_params", "num_bits"], 8.0,
     "weight_quant_params.num_bits must be an integer, got 8.0"),
    (["conv1", "weight_quant_params", "wts_algo"], "nuq",
     "weight_quant_params.wts_algo must be \"arq_quantize\", got \"nuq\""),
    (["conv1", "weight_quant_params"], [],
     "weight_quant_params must be a JSON object, got a list"),
])
def test_layer_parameter_errors(tmp_path, keys, value, expect):
    e, path = _err(tmp_path, _with(keys, value))
    assert str(e) == f"{path}, layer 'conv1': {expect}"


def test_hfmg_bins_validated(tmp_path):
    layer = {"activation_quant_params": {"act_algo": "hfmg", "num_of_bins": 3000}}
    e, path = _err(tmp_path, json.dumps(_doc(fc1=layer)))
    assert str(e) == (f"{path}, layer 'fc1': activation_quant_params.num_of_bins must be one of "
                      "1024, 2048, 4096, 8192, got 3000")
    layer = {"activation_quant_params": {"act_algo": "hfmg", "search_step": 0.1}}
    e, path = _err(tmp_path, json.dumps(_doc(fc1=layer)))
    assert "unknown parameter 'search_step' in activation_quant_params (hfmg)" in str(e)


def test_channel_wise_for_inner_product_refused(tmp_path):
    e, path = _err(tmp_path, json.dumps(_doc(fc1={"weight_quant_params": {"channel_wise": True}})))
    assert str(e) == (f"{path}, layer 'fc1': weight_quant_params.channel_wise: true is only allowed "
                      "for Convolution/Deconvolution, layer type is InnerProduct")


@pytest.mark.parametrize("key,value,expect", [
    ("version", 2, "version must be 1, got 2"),
    ("batch_num", 0, "batch_num must be >= 1, got 0"),
    ("batch_num", "2", "batch_num must be an integer, got \"2\""),
    ("do_fusion", None, "do_fusion must be true or false, got null"),
    ("skip_fusion_layers", "conv1", "skip_fusion_layers must be a list of layer names, got \"conv1\""),
])
def test_global_errors(tmp_path, key, value, expect):
    e, path = _err(tmp_path, _with([key], value))
    assert str(e) == f"{path}: {expect}"


def test_skip_fusion_unknown_layer(tmp_path):
    e, path = _err(tmp_path, _with(["skip_fusion_layers"], ["bn7"]))
    assert str(e) == (f"{path}, layer 'bn7': skip_fusion_layers: unknown layer 'bn7': the model "
                      "has no layer of that name")


@pytest.mark.parametrize("text,line", [("{\n \"batch_num\": 1,\n}", 3), ("[1, 2", 1), ("", 1)])
def test_invalid_json_names_line(tmp_path, text, line):
    e, path = _err(tmp_path, text)
    assert e.line == line and str(e).startswith(f"{path}:{line}: not valid JSON: ")


def test_top_level_must_be_object(tmp_path):
    e, path = _err(tmp_path, "[]")
    assert str(e) == f"{path}: the top level must be a JSON object, got a list"


def test_nothing_enabled(tmp_path):
    e, path = _err(tmp_path, _with(["conv1", "quant_enable"], False))
    assert str(e) == f"{path}: nothing to quantize: no layer has \"quant_enable\": true"


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    out = tmp_path / "q.json"
    out.write_text("old")
    write_quant_config_json(str(out), QuantConfig(layers={"conv1": LayerQuantConfig()}))
    assert json.loads(out.read_text()) == quant_config_to_json(QuantConfig(layers={"conv1": LayerQuantConfig()}))
    assert [p.name for p in tmp_path.iterdir()] == ["q.json"]
