"""Property-based tests: random valid quant.cfg files resolve and survive the JSON round trip;
random corruptions of valid quant.cfg and JSON files give ConfigError, never another
exception."""
from __future__ import annotations

import json
import os
import tempfile

from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amct_torch.config import parse_quant_cfg_text, parse_quant_config_json, quant_config_to_json, resolve_quant_cfg
from amct_torch.errors import ConfigError
from amct_torch.proto import calibration_config_pb2 as pb
from helpers.configs import LAYERS
from helpers.corrupt import corrupt_text

QUANTIZABLE = ["conv1", "conv2", "deconv1", "fc1", "pool1"]
TYPES = {"conv1": "Convolution", "conv2": "Convolution", "deconv1": "Deconvolution",
         "fc1": "InnerProduct", "pool1": "Pooling"}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def calibration(draw, channel_wise_ok: bool) -> pb.CalibrationConfig:
    cc = pb.CalibrationConfig()
    if draw(st.booleans()):
        cc.arq_quantize.channel_wise = draw(st.booleans()) and channel_wise_ok
    algo = draw(st.sampled_from(["none", "ifmr", "hfmg"]))
    if algo == "ifmr":
        q = cc.ifmr_quantize
        start = draw(st.floats(0.05, 1.0))
        end = start + draw(st.floats(0.05, 1.0))
        q.search_range_start, q.search_range_end = start, end
        q.search_step = (end - start) * draw(st.floats(0.01, 0.9))
        q.max_percentile = draw(st.floats(0.51, 1.0))
        q.min_percentile = draw(st.floats(0.51, 1.0))
        if draw(st.booleans()):
            q.asymmetric = draw(st.booleans())
    elif algo == "hfmg":
        cc.hfmg_quantize.num_of_bins = draw(st.sampled_from([1024, 2048, 4096, 8192]))
        if draw(st.booleans()):
            cc.hfmg_quantize.asymmetric = draw(st.booleans())
    return cc


@st.composite
def configs(draw) -> pb.AMCTConfig:
    cfg = pb.AMCTConfig(batch_num=draw(st.integers(1, 100)),
                        activation_offset=draw(st.booleans()), joint_quant=draw(st.booleans()),
                        do_fusion=draw(st.booleans()))
    skips = draw(st.lists(st.sampled_from(QUANTIZABLE), unique=True, max_size=4))
    cfg.skip_layers.extend(skips)
    if draw(st.booleans()):
        cfg.common_config.CopyFrom(draw(calibration(True)))
    for t in draw(st.lists(st.sampled_from(sorted(set(TYPES.values()))), unique=True, max_size=3)):
        o = cfg.override_layer_types.add(layer_type=t)
        o.calibration_config.CopyFrom(draw(calibration(t in ("Convolution", "Deconvolution"))))
    for n in draw(st.lists(st.sampled_from(QUANTIZABLE), unique=True, max_size=3)):
        o = cfg.override_layer_configs.add(layer_name=n)
        o.calibration_config.CopyFrom(draw(calibration(TYPES[n] != "InnerProduct" and n != "pool1")))
    cfg.skip_fusion_layers.extend(draw(st.lists(st.sampled_from(["conv1", "relu1", "fc1"]),
                                                unique=True, max_size=2)))
    return cfg


@SETTINGS
@given(configs())
def test_valid_configs_resolve_and_round_trip_through_json(cfg):
    text = text_format.MessageToString(cfg)
    qc = resolve_quant_cfg(parse_quant_cfg_text(text, "r.cfg"), LAYERS, "r.cfg")
    assert set(qc.layers) == set(QUANTIZABLE)
    assert {n for n, c in qc.layers.items() if not c.quant_enable} == set(cfg.skip_layers)
    back = parse_quant_config_json(json.dumps(quant_config_to_json(qc)), LAYERS, "r.json")
    assert back == qc


@SETTINGS
@given(configs(), st.data())
def test_corrupted_quant_cfg_gives_config_error_or_valid_config(cfg, data):
    text = corrupt_text(text_format.MessageToString(cfg), data)
    try:
        resolve_quant_cfg(parse_quant_cfg_text(text, "c.cfg"), LAYERS, "c.cfg")
    except ConfigError as e:
        assert e.file == "c.cfg"


@SETTINGS
@given(configs(), st.data())
def test_corrupted_json_gives_config_error_or_valid_config(cfg, data):
    qc = resolve_quant_cfg(cfg, LAYERS, "c.cfg")
    text = corrupt_text(json.dumps(quant_config_to_json(qc), indent=1), data)
    try:
        parse_quant_config_json(text, LAYERS, "c.json")
    except ConfigError as e:
        assert e.file == "c.json"


def test_quant_cfg_file_reader_matches_text_reader():
    cfg = 'skip_layers: "conv1"\n'
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "q.cfg")
        with open(p, "w") as f:
            f.write(cfg)
        from amct_torch.config import parse_quant_cfg
        assert parse_quant_cfg(p) == parse_quant_cfg_text(cfg)
