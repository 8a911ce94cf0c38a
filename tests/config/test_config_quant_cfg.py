"""quant.cfg: the seed document's examples, every precedence case and every validation rule of
docs/config_and_record.md ("quant.cfg resolution"), each with the resolved value or the exact error."""
from __future__ import annotations

import os
import warnings

import pytest

from amct_torch.config import LayerInfo, parse_quant_cfg, resolve_quant_cfg
from amct_torch.errors import ConfigError
from helpers.configs import DATA, LAYERS, write


def resolve(tmp_path, text: str, layers=LAYERS):
    path = write(tmp_path, "quant.cfg", text)
    return resolve_quant_cfg(parse_quant_cfg(path), layers, path), path


def error(tmp_path, text: str, layers=LAYERS) -> tuple[ConfigError, str]:
    path = write(tmp_path, "quant.cfg", text)
    with pytest.raises(ConfigError) as ei:
        resolve_quant_cfg(parse_quant_cfg(path), layers, path)
    return ei.value, path


IFMR = ("ifmr_quantize {{ search_range_start: {s} search_range_end: {e} search_step: {st} "
        "max_percentile: {mx} min_percentile: {mn} }}")


def ifmr(s=0.7, e=1.3, st=0.01, mx=0.999999, mn=0.999999) -> str:
    return IFMR.format(s=s, e=e, st=st, mx=mx, mn=mn)


# --------------------------------------------------------------------------- seed examples

def test_seed_example_parses_with_keys_split_over_lines():
    cfg = parse_quant_cfg(os.path.join(DATA, "seed003_quant.cfg"))
    assert list(cfg.skip_layers) == ["Opname"]
    assert list(cfg.skip_layer_types) == ["Optype"]
    assert list(cfg.skip_fusion_layers) == ["Opname"]
    assert cfg.override_layer_types[0].layer_type == "Optype"
    assert cfg.override_layer_configs[0].layer_name == "Opname"
    assert cfg.batch_num == 2 and cfg.activation_offset and not cfg.joint_quant and cfg.do_fusion
    q = cfg.override_layer_configs[0].calibration_config.ifmr_quantize
    assert q.search_range_start == pytest.approx(0.8) and q.search_step == pytest.approx(0.02)
    assert q.HasField("asymmetric") and not q.asymmetric


def test_seed_example_against_model_without_opname_names_it():
    path = os.path.join(DATA, "seed003_quant.cfg")
    with pytest.raises(ConfigError) as ei:
        resolve_quant_cfg(parse_quant_cfg(path), LAYERS, path)
    assert ei.value.file == path and ei.value.layer == "Opname"
    assert "skip_layers: unknown layer 'Opname'" in str(ei.value)


def test_seed_example_against_model_with_opname_but_no_optype_names_the_type():
    path = os.path.join(DATA, "seed003_quant.cfg")
    layers = LAYERS + [LayerInfo("Opname", "Convolution", True, True, 3)]
    with pytest.raises(ConfigError) as ei:
        resolve_quant_cfg(parse_quant_cfg(path), layers, path)
    assert str(ei.value) == (
        f"{path}: skip_layer_types: unknown layer type 'Optype': no layer of that type in the "
        "model (quantizable types: Convolution, Deconvolution, InnerProduct, Pooling, "
        "DepthwiseConvolution, ConvolutionDepthwise)")


def test_seed_example_with_opname_and_optype_replaced_resolves(tmp_path):
    text = open(os.path.join(DATA, "seed003_quant.cfg"), encoding="utf-8").read()
    text = text.replace("Optype", "Deconvolution").replace("Opname", "conv2")
    text = text.replace("skip_layers : \"\nconv2\n\"", "skip_layers : \"\npool1\n\"")
    qc, _ = resolve(tmp_path, text)
    assert not qc.layers["pool1"].quant_enable           # skip_layers
    assert not qc.layers["deconv1"].quant_enable         # skip_layer_types
    c2 = qc.layers["conv2"]                              # override_layer_configs
    assert (c2.search_range, c2.search_step, c2.asymmetric, c2.channel_wise) == \
        ((0.8, 1.2), 0.02, False, True)
    c1 = qc.layers["conv1"]                              # common_config
    assert (c1.search_range, c1.search_step, c1.asymmetric) == ((0.7, 1.3), 0.01, True)
    assert qc.batch_num == 2 and qc.skip_fusion_layers == ["conv2"]


def test_seed_hfmg_snippet_with_split_word_names_file_line_and_word():
    path = os.path.join(DATA, "seed003_hfmg.cfg")
    with pytest.raises(ConfigError) as ei:
        parse_quant_cfg(path)
    assert ei.value.file == path and ei.value.line == 7     # the stray line "a"
    msg = str(ei.value)
    assert msg.startswith(f"{path}:7: ")
    assert 'has no field named "a"' in msg
    assert "'asymmetric' seems to be split across lines 7 and 8" in msg


def test_field_written_symmetric_suggests_asymmetric(tmp_path):
    path = write(tmp_path, "q.cfg", "common_config {\n hfmg_quantize {\n  symmetric: false\n }\n}\n")
    with pytest.raises(ConfigError) as ei:
        parse_quant_cfg(path)
    assert ei.value.line == 3
    assert "has no field named \"symmetric\"" in str(ei.value)
    assert "Did you mean 'asymmetric'?" in str(ei.value)


def test_seed_hfmg_snippet_fixed_resolves_to_hfmg(tmp_path):
    text = open(os.path.join(DATA, "seed003_hfmg.cfg"), encoding="utf-8").read()
    qc, _ = resolve(tmp_path, text.replace("a\nsymmetric", "asymmetric"))
    c = qc.layers["conv1"]
    assert (c.act_algo, c.num_of_bins, c.asymmetric, c.search_range) == ("hfmg", 4096, False, None)


# --------------------------------------------------------------------------- defaults

def test_empty_cfg_gives_defaults(tmp_path):
    qc, _ = resolve(tmp_path, "")
    assert list(qc.layers) == ["conv1", "conv2", "deconv1", "fc1", "pool1"]   # sorted by name
    for name, c in qc.layers.items():
        assert c.quant_enable and c.act_algo == "ifmr" and c.num_bits == 8
        assert (c.search_range, c.search_step, c.max_percentile, c.min_percentile) == \
            ((0.7, 1.3), 0.01, 0.999999, 0.999999)
        assert c.asymmetric is True and c.wts_algo == "arq_quantize"
        assert c.channel_wise == (name in ("conv1", "conv2", "deconv1"))
    assert (qc.batch_num, qc.activation_offset, qc.joint_quant, qc.do_fusion) == (1, True, False, True)


def test_hfmg_default_bins(tmp_path):
    qc, _ = resolve(tmp_path, "common_config { hfmg_quantize { } }")
    assert {c.num_of_bins for c in qc.layers.values()} == {4096}


def test_globals_are_read(tmp_path):
    qc, _ = resolve(tmp_path, 'batch_num: 7 joint_quant: true do_fusion: false '
                              'skip_fusion_layers: "conv1" skip_fusion_layers: "relu1"')
    assert (qc.batch_num, qc.joint_quant, qc.do_fusion, qc.skip_fusion_layers) == \
        (7, True, False, ["conv1", "relu1"])


# --------------------------------------------------------------------------- precedence

def test_activation_offset_false_makes_layers_symmetric(tmp_path):
    qc, _ = resolve(tmp_path, "activation_offset: false")
    assert {c.asymmetric for c in qc.layers.values()} == {False}


def test_common_config_asymmetric_beats_activation_offset(tmp_path):
    qc, _ = resolve(tmp_path, "activation_offset: false common_config { ifmr_quantize { asymmetric: true } }")
    assert {c.asymmetric for c in qc.layers.values()} == {True}


def test_common_config_without_asymmetric_falls_back_to_activation_offset(tmp_path):
    qc, _ = resolve(tmp_path, "activation_offset: false common_config { hfmg_quantize { num_of_bins: 2048 } }")
    assert {(c.asymmetric, c.num_of_bins) for c in qc.layers.values()} == {(False, 2048)}


def test_override_type_beats_common(tmp_path):
    qc, _ = resolve(tmp_path, f"""
        common_config {{ {ifmr(0.6, 1.4, 0.05)} }}
        override_layer_types {{ layer_type: "Convolution" calibration_config {{ {ifmr(0.8, 1.2, 0.02)} }} }}""")
    assert qc.layers["conv1"].search_range == (0.8, 1.2) and qc.layers["conv2"].search_step == 0.02
    assert qc.layers["fc1"].search_range == (0.6, 1.4) and qc.layers["deconv1"].search_step == 0.05


def test_override_layer_beats_override_type(tmp_path):
    qc, _ = resolve(tmp_path, f"""
        override_layer_types {{ layer_type: "Convolution" calibration_config {{ {ifmr(0.8, 1.2, 0.02)} }} }}
        override_layer_configs {{ layer_name: "conv1" calibration_config {{ {ifmr(0.9, 1.1, 0.1)} }} }}""")
    assert (qc.layers["conv1"].search_range, qc.layers["conv1"].search_step) == ((0.9, 1.1), 0.1)
    assert qc.layers["conv2"].search_range == (0.8, 1.2)
    assert qc.layers["fc1"].search_range == (0.7, 1.3)


def test_asymmetric_cascades_through_sources(tmp_path):
    # conv1's own override says nothing about asymmetric: the type override decides;
    # fc1 only has common_config, which says nothing either: activation_offset decides.
    qc, _ = resolve(tmp_path, """
        activation_offset: false
        common_config { hfmg_quantize { } }
        override_layer_types { layer_type: "Convolution" calibration_config { ifmr_quantize { asymmetric: true } } }
        override_layer_configs { layer_name: "conv1" calibration_config { hfmg_quantize { num_of_bins: 8192 } } }""")
    assert (qc.layers["conv1"].act_algo, qc.layers["conv1"].num_of_bins, qc.layers["conv1"].asymmetric) == \
        ("hfmg", 8192, True)
    assert (qc.layers["conv2"].act_algo, qc.layers["conv2"].asymmetric) == ("ifmr", True)
    assert (qc.layers["fc1"].act_algo, qc.layers["fc1"].asymmetric) == ("hfmg", False)


def test_highest_source_applies_as_a_whole(tmp_path):
    # conv1's override has no arq_quantize: channel_wise takes the default (true), not the
    # type override's false; its missing IFMR fields take the defaults, not common's.
    qc, _ = resolve(tmp_path, f"""
        common_config {{ {ifmr(0.5, 1.5, 0.1)} }}
        override_layer_types {{ layer_type: "Convolution" calibration_config {{ arq_quantize {{ channel_wise: false }} }} }}
        override_layer_configs {{ layer_name: "conv1" calibration_config {{ ifmr_quantize {{ search_step: 0.02 }} }} }}""")
    c1 = qc.layers["conv1"]
    assert (c1.channel_wise, c1.search_range, c1.search_step) == (True, (0.7, 1.3), 0.02)
    c2 = qc.layers["conv2"]
    assert (c2.channel_wise, c2.search_range) == (False, (0.7, 1.3))


@pytest.mark.parametrize("first,second,algo", [
    ("ifmr_quantize { search_step: 0.02 }", "hfmg_quantize { num_of_bins: 1024 }", "hfmg"),
    ("hfmg_quantize { num_of_bins: 1024 }", "ifmr_quantize { search_step: 0.02 }", "ifmr"),
])
def test_last_activation_algorithm_wins(tmp_path, first, second, algo):
    qc, _ = resolve(tmp_path, f"common_config {{ {first} {second} }}")
    c = qc.layers["conv1"]
    assert c.act_algo == algo
    assert (c.num_of_bins, c.search_step) == ((1024, None) if algo == "hfmg" else (None, 0.02))


def test_common_channel_wise_true_applies_to_conv_and_deconv_only(tmp_path):
    qc, _ = resolve(tmp_path, "common_config { arq_quantize { channel_wise: true } }")
    assert {n: c.channel_wise for n, c in qc.layers.items()} == \
        {"conv1": True, "conv2": True, "deconv1": True, "fc1": False, "pool1": False}


def test_common_channel_wise_false_makes_conv_per_tensor(tmp_path):
    qc, _ = resolve(tmp_path, "common_config { arq_quantize { channel_wise: false } }")
    assert {c.channel_wise for c in qc.layers.values()} == {False}


def test_deprecated_configs_apply_without_common_and_types(tmp_path):
    with pytest.warns(DeprecationWarning, match="deprecated"):
        qc, _ = resolve(tmp_path, f"""
            conv_calibration_config {{ arq_quantize {{ channel_wise: false }} {ifmr(0.8, 1.2, 0.02)} }}
            fc_calibration_config {{ hfmg_quantize {{ num_of_bins: 2048 asymmetric: false }} }}
            override_layer_configs {{ layer_name: "conv2" calibration_config {{ {ifmr(0.9, 1.1, 0.1)} }} }}""")
    assert (qc.layers["conv1"].search_range, qc.layers["conv1"].channel_wise) == ((0.8, 1.2), False)
    assert qc.layers["deconv1"].search_range == (0.8, 1.2)
    assert qc.layers["conv2"].search_range == (0.9, 1.1)        # override_layer_configs wins
    for n in ("fc1", "pool1"):
        assert (qc.layers[n].act_algo, qc.layers[n].num_of_bins, qc.layers[n].asymmetric) == \
            ("hfmg", 2048, False)


@pytest.mark.parametrize("other", [
    "common_config { ifmr_quantize { search_step: 0.05 } }",
    'override_layer_types { layer_type: "InnerProduct" calibration_config { ifmr_quantize { search_step: 0.05 } } }',
])
def test_deprecated_configs_ignored_with_warning_when_common_or_types_given(tmp_path, other):
    with pytest.warns(UserWarning, match="conv_calibration_config ignored"):
        qc, _ = resolve(tmp_path, f"conv_calibration_config {{ {ifmr(0.8, 1.2, 0.02)} }} {other}")
    assert qc.layers["conv1"].search_range == (0.7, 1.3)


def test_skip_layers_and_types_disable_layers(tmp_path):
    qc, _ = resolve(tmp_path, 'skip_layers: "conv1" skip_layer_types: "Pooling"')
    assert {n: c.quant_enable for n, c in qc.layers.items()} == \
        {"conv1": False, "conv2": True, "deconv1": True, "fc1": True, "pool1": False}


def test_key_with_surrounding_newlines_is_stripped_but_inner_text_kept(tmp_path):
    qc, _ = resolve(tmp_path, 'skip_layers: "\n  conv1  \n"\nbatch_num: 3\n')
    assert not qc.layers["conv1"].quant_enable and qc.batch_num == 3


# --------------------------------------------------------------------------- validation

def _msg(e: ConfigError, path: str, text: str, layer=None) -> None:
    assert e.file == path and e.layer == layer
    assert str(e) == (f"{path}, layer '{layer}': {text}" if layer else f"{path}: {text}")


@pytest.mark.parametrize("field,value,ok", [
    ("max_percentile", 0.5, False), ("max_percentile", 0.50001, True),
    ("max_percentile", 1.0, True), ("max_percentile", 1.01, False),
    ("min_percentile", 0.4, False), ("min_percentile", 1.0, True), ("min_percentile", -1, False),
])
def test_percentile_range(tmp_path, field, value, ok):
    text = f"common_config {{ ifmr_quantize {{ {field}: {value} }} }}"
    if ok:
        qc, _ = resolve(tmp_path, text)
        assert getattr(qc.layers["fc1"], field) == pytest.approx(value, rel=1e-7)
    else:
        e, path = error(tmp_path, text)
        assert str(e).startswith(f"{path}: common_config: ifmr_quantize.{field} must be in (0.5, 1], got ")


@pytest.mark.parametrize("s,e,st,expect", [
    (0.0, 1.3, 0.01, "search range must satisfy 0 < search_range_start < search_range_end, got start 0.0, end 1.3"),
    (-0.1, 1.3, 0.01, "search range must satisfy 0 < search_range_start < search_range_end, got start -0.1, end 1.3"),
    (1.0, 1.0, 0.01, "search range must satisfy 0 < search_range_start < search_range_end, got start 1.0, end 1.0"),
    (1.2, 0.8, 0.01, "search range must satisfy 0 < search_range_start < search_range_end, got start 1.2, end 0.8"),
    (0.5, 1.5, 0.0, "search_step must satisfy 0 < search_step <= search_range_end - search_range_start = 1.0, got 0.0"),
    (0.5, 1.5, 1.5, "search_step must satisfy 0 < search_step <= search_range_end - search_range_start = 1.0, got 1.5"),
    (0.5, 1.5, 1.0, None),
])
def test_search_range_and_step(tmp_path, s, e, st, expect):
    text = f'override_layer_configs {{ layer_name: "fc1" calibration_config {{ {ifmr(s, e, st)} }} }}'
    if expect is None:
        qc, _ = resolve(tmp_path, text)
        assert (qc.layers["fc1"].search_range, qc.layers["fc1"].search_step) == ((s, e), st)
    else:
        err, path = error(tmp_path, text)
        _msg(err, path, f"override_layer_configs: ifmr_quantize: {expect}", "fc1")


@pytest.mark.parametrize("bins,ok", [(1024, True), (2048, True), (4096, True), (8192, True),
                                     (1000, False), (0, False), (16384, False)])
def test_num_of_bins(tmp_path, bins, ok):
    text = f'override_layer_types {{ layer_type: "Pooling" calibration_config {{ hfmg_quantize {{ num_of_bins: {bins} }} }} }}'
    if ok:
        qc, _ = resolve(tmp_path, text)
        assert qc.layers["pool1"].num_of_bins == bins
    else:
        e, path = error(tmp_path, text)
        _msg(e, path, "override_layer_types 'Pooling': hfmg_quantize.num_of_bins must be one of "
                      f"1024, 2048, 4096, 8192, got {bins}")


CW = ("arq_quantize.channel_wise: true is only allowed for Convolution/Deconvolution "
      "(InnerProduct and Pooling are quantized per tensor); set channel_wise: false")


@pytest.mark.parametrize("text,where,layer", [
    ('override_layer_configs { layer_name: "fc1" calibration_config { arq_quantize { channel_wise: true } } }',
     "override_layer_configs", "fc1"),
    ('override_layer_configs { layer_name: "pool1" calibration_config { arq_quantize { channel_wise: true } } }',
     "override_layer_configs", "pool1"),
    ('override_layer_types { layer_type: "InnerProduct" calibration_config { arq_quantize { channel_wise: true } } }',
     "override_layer_types 'InnerProduct'", None),
])
def test_channel_wise_only_for_conv_and_deconv(tmp_path, text, where, layer):
    e, path = error(tmp_path, text)
    _msg(e, path, f"{where}: {CW}", layer)


def test_channel_wise_true_in_deprecated_fc_config_refused(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        e, path = error(tmp_path, "fc_calibration_config { arq_quantize { channel_wise: true } }")
    _msg(e, path, f"fc_calibration_config: {CW}")


def test_channel_wise_true_for_deconv_override_is_fine(tmp_path):
    qc, _ = resolve(tmp_path, 'override_layer_configs { layer_name: "deconv1" calibration_config { arq_quantize { channel_wise: true } } }')
    assert qc.layers["deconv1"].channel_wise


@pytest.mark.parametrize("text,expect,layer", [
    ('skip_layers: "nope"', "skip_layers: unknown layer 'nope': the model has no layer of that name", "nope"),
    ('skip_layers: "relu1"', "skip_layers: layer 'relu1' (type ReLU) is not quantizable", "relu1"),
    ('skip_layers: "pool2"', "skip_layers: layer 'pool2' (type Pooling) is not quantizable", "pool2"),
    ('skip_layers: "conv1" skip_layers: "conv1"', "skip_layers entry 'conv1' is given more than once", None),
    ('skip_layer_types: "ReLU"', "skip_layer_types: layer type 'ReLU' is not quantizable (quantizable "
     "types: Convolution, Deconvolution, InnerProduct, Pooling, DepthwiseConvolution, "
     "ConvolutionDepthwise)", None),
    ('skip_layer_types: "Optype"', "skip_layer_types: unknown layer type 'Optype': no layer of that type "
     "in the model (quantizable types: Convolution, Deconvolution, InnerProduct, Pooling, "
     "DepthwiseConvolution, ConvolutionDepthwise)", None),
    ('override_layer_configs { layer_name: "Opname" calibration_config { } }',
     "override_layer_configs: unknown layer 'Opname': the model has no layer of that name", "Opname"),
    ('override_layer_configs { layer_name: "prob" calibration_config { } }',
     "override_layer_configs: layer 'prob' (type Softmax) is not quantizable", "prob"),
    ('override_layer_configs { layer_name: "fc1" calibration_config { } } '
     'override_layer_configs { layer_name: "fc1" calibration_config { } }',
     "override_layer_configs: layer 'fc1' is given more than once", "fc1"),
    ('override_layer_types { layer_type: "Optype" calibration_config { } }',
     "override_layer_types: unknown layer type 'Optype': no layer of that type in the model "
     "(quantizable types: Convolution, Deconvolution, InnerProduct, Pooling, DepthwiseConvolution, "
     "ConvolutionDepthwise)", None),
    ('override_layer_types { layer_type: "Pooling" calibration_config { } } '
     'override_layer_types { layer_type: "Pooling" calibration_config { } }',
     "override_layer_types: layer type 'Pooling' is given more than once", None),
    ('skip_fusion_layers: "bn9"', "skip_fusion_layers: unknown layer 'bn9': the model has no layer of "
     "that name", "bn9"),
    ("batch_num: 0", "batch_num must be >= 1, got 0", None),
])
def test_names_types_and_globals_validated(tmp_path, text, expect, layer):
    e, path = error(tmp_path, text)
    _msg(e, path, expect, layer)


def test_nothing_left_to_quantize(tmp_path):
    e, path = error(tmp_path, 'skip_layer_types: "Convolution" skip_layer_types: "Deconvolution" '
                              'skip_layers: "fc1" skip_layers: "pool1"')
    _msg(e, path, "nothing left to quantize: the model has no quantizable layer that is not "
                  "skipped (quantizable: Convolution, Deconvolution, InnerProduct, AVE Pooling)")


def test_model_without_quantizable_layers(tmp_path):
    e, path = error(tmp_path, "", layers=[LayerInfo("relu", "ReLU", False, False)])
    assert "nothing left to quantize" in str(e)


@pytest.mark.parametrize("text,line,part", [
    ("batch_num: 2\nbatch_num: x\n", 2, "batch_num"),
    ("common_config {\n  ifmr_quantize {\n", 2, "Expected \"}\""),  # unclosed at EOF
    ('override_layer_types {\n layer_type: "Pooling"\n}\n', None,
     "quant.cfg is missing required field(s): override_layer_types[0].calibration_config"),
    ("batch_num: -1\n", 1, "cannot parse quant.cfg"),
    ("unknown_field: 1\n", 1, 'has no field named "unknown_field"'),
    ('skip_layers: "con\nv1"\n', 1, "cannot parse quant.cfg"),
])
def test_syntax_errors_name_file_and_line(tmp_path, text, line, part):
    path = write(tmp_path, "q.cfg", text)
    with pytest.raises(ConfigError) as ei:
        parse_quant_cfg(path)
    assert ei.value.file == path and ei.value.line == line and part in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="quant.cfg not found"):
        parse_quant_cfg(str(tmp_path / "none.cfg"))


def test_not_utf8(tmp_path):
    p = tmp_path / "q.cfg"
    p.write_bytes(b"batch_num: 1 \xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        parse_quant_cfg(str(p))
