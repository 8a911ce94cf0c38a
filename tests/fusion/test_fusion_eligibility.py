"""Each eligibility rule of docs/fusion.md has a net where it alone stops the fusion: the result then
keeps BatchNorm and Scale, names the reason, and still computes what the original computes."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net, rand
from helpers.fusion import assert_rel, bn_blobs, bn_text, forward, scale_blobs, scale_text


def _conv(name, bottom, top, n, k, extra=""):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} {extra} }} }}\n')


def _conv_bn_scale(bn_extra="", scale_extra="", var=None):
    """x(1,3,6,6) -> conv1 (c1) -> bn1 (b1) -> sc1 (s1)."""
    body = (_conv("conv1", "x", "c1", 4, 3, "pad: 1") + bn_text("bn1", "c1", "b1", bn_extra)
            + scale_text("sc1", "b1", "s1", extra=scale_extra))
    blobs = {"conv1": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)], "bn1": bn_blobs(4, 3, var=var),
             "sc1": scale_blobs(4, 4)}
    return body, {"x": [2, 3, 6, 6]}, blobs


def _refused(tmp_path, body, inputs, blobs, *, expect_layer, reason, **kwargs):
    proto, model = make_net(tmp_path, body, inputs, blobs)
    gm = load_caffe(proto, model)
    xs = [rand(*shape, seed=7 + i, scale=2.0) for i, shape in enumerate(inputs.values())]
    res = fuse_bn(gm, **kwargs)
    assert res.fused == {}
    assert reason in res.refused[expect_layer], res.refused
    kept = layer_modules(res.graph)
    assert {"BatchNorm", "Scale"} <= {m.caffe_type for m in kept.values()}
    assert not getattr(kept[expect_layer], "fused_layers", [])
    ref, got = forward(gm, *xs), forward(res.graph, *xs)
    assert ref.keys() == got.keys()
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
    return res


def test_do_fusion_false(tmp_path):
    _refused(tmp_path, *_conv_bn_scale(), expect_layer="conv1", reason="do_fusion is false", do_fusion=False)


@pytest.mark.parametrize("name", ["conv1", "bn1"])
def test_skip_fusion_layers(tmp_path, name):
    _refused(tmp_path, *_conv_bn_scale(), expect_layer="conv1", reason="skip_fusion_layers",
             skip_fusion_layers=[name])


def test_record_skip_fusion(tmp_path):
    _refused(tmp_path, *_conv_bn_scale(), expect_layer="conv1", reason="record sets skip_fusion",
             record_skip_fusion={"conv1"})


def test_other_skip_names_do_not_stop_fusion(tmp_path):
    proto, model = make_net(tmp_path, *_conv_bn_scale())
    res = fuse_bn(load_caffe(proto, model), skip_fusion_layers=["conv9"], record_skip_fusion=["fc"])
    assert res.fused == {"conv1": ["bn1", "sc1"]}


def test_conv_output_read_before_inplace_bn(tmp_path):
    # Caffe order: conv1 writes c; pool reads c; then bn1/sc1 rewrite c in place. Pool must keep
    # seeing the raw conv output, so conv1's output has two consumers and cannot absorb bn1.
    body = (_conv("conv1", "x", "c", 4, 3, "pad: 1")
            + 'layer { name: "pool" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: MAX kernel_size: 2 } }\n'
            + bn_text("bn1", "c", "c") + scale_text("sc1", "c", "c"))
    blobs = {"conv1": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)], "bn1": bn_blobs(4, 3), "sc1": scale_blobs(4, 4)}
    _refused(tmp_path, body, {"x": [2, 3, 6, 6]}, blobs, expect_layer="conv1",
             reason="output of 'conv1' has 2 consumers")


def test_bn_output_with_second_consumer(tmp_path):
    body, inputs, blobs = _conv_bn_scale()
    body += 'layer { name: "relu" type: "ReLU" bottom: "b1" top: "r" }\n'
    _refused(tmp_path, body, inputs, blobs, expect_layer="conv1", reason="output of 'bn1' has 2 consumers")


def test_bn_with_batch_statistics(tmp_path):
    _refused(tmp_path, *_conv_bn_scale(bn_extra="use_global_stats: false"), expect_layer="conv1",
             reason="use_global_stats: false")


def test_scale_over_two_axes(tmp_path):
    body, inputs, blobs = _conv_bn_scale(scale_extra="num_axes: 2")
    blobs["sc1"] = [rand(4, 6, seed=5), rand(4, 6, seed=6)]  # one factor per (channel, row)
    _refused(tmp_path, body, inputs, blobs, expect_layer="conv1", reason="num_axes 2")


def test_scale_with_second_bottom(tmp_path):
    body = (_conv("conv1", "x", "c1", 4, 3, "pad: 1") + bn_text("bn1", "c1", "b1")
            + 'layer { name: "sc1" type: "Scale" bottom: "b1" bottom: "g" top: "s1" scale_param { bias_term: true } }\n')
    blobs = {"conv1": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)], "bn1": bn_blobs(4, 3), "sc1": [rand(4, seed=4)]}
    _refused(tmp_path, body, {"x": [2, 3, 6, 6], "g": [4]}, blobs, expect_layer="conv1", reason="second bottom")


def test_non_finite_result_warns(tmp_path, caplog):
    # a negative variance is refused when the model loads; a finite but huge Scale still makes
    # the folded weights overflow: gamma / sqrt(var + eps) for channel 1 is past float32's range
    body, inputs, blobs = _conv_bn_scale()
    blobs["sc1"][0][1] = 3e38
    blobs["bn1"][1][1] = 0.0
    with caplog.at_level(logging.WARNING, logger="amct_torch.fusion"):
        _refused(tmp_path, body, inputs, blobs, expect_layer="conv1", reason="non-finite", file="m.prototxt")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "conv1" in warnings[0].getMessage() and "m.prototxt" in warnings[0].getMessage()


def test_inner_product_on_axis_2(tmp_path):
    # IP with axis 2 keeps axis 1 (here 3 rows) as the channel BatchNorm normalises, not its outputs
    body = ('layer { name: "fc" type: "InnerProduct" bottom: "x" top: "f" '
            'inner_product_param { num_output: 5 axis: 2 } }\n' + bn_text("bn1", "f", "f") + scale_text("sc1", "f", "f"))
    blobs = {"fc": [rand(5, 8, seed=1), rand(5, seed=2)], "bn1": bn_blobs(3, 3), "sc1": scale_blobs(3, 4)}
    _refused(tmp_path, body, {"x": [2, 3, 8]}, blobs, expect_layer="fc", reason="axis 2")


def _bn_scale_conv(conv_extra, cin=4, scale_top_reader=""):
    body = (bn_text("bn0", "x", "b") + scale_text("sc0", "b", "s") + _conv("conv1", "s", "c", 4, 3, conv_extra)
            + scale_top_reader)
    wshape = (4, cin, 3, 3)
    blobs = {"bn0": bn_blobs(4, 3), "sc0": scale_blobs(4, 4), "conv1": [rand(*wshape, seed=5), rand(4, seed=6)]}
    return body, {"x": [2, 4, 7, 7]}, blobs


def test_input_side_with_padding(tmp_path):
    # pad zeros enter after BN in the original; folded, they would have to be -c/a instead
    _refused(tmp_path, *_bn_scale_conv("pad: 1"), expect_layer="conv1", reason="needs pad 0")


def test_input_side_with_groups(tmp_path):
    _refused(tmp_path, *_bn_scale_conv("group: 2", cin=2), expect_layer="conv1", reason="needs group 1")


def test_input_side_scale_output_read_twice(tmp_path):
    reader = 'layer { name: "relu" type: "ReLU" bottom: "s" top: "r" }\n'
    _refused(tmp_path, *_bn_scale_conv("", scale_top_reader=reader), expect_layer="conv1",
             reason="output of 'sc0' has 2 consumers")


def test_input_side_pad_zero_is_fused(tmp_path):
    # the control for the three cases above: the same net with pad 0, group 1 does fuse
    proto, model = make_net(tmp_path, *_bn_scale_conv(""))
    gm = load_caffe(proto, model)
    res = fuse_bn(gm)
    assert res.fused == {"conv1": ["bn0", "sc0"]} and res.refused == {}
    x = rand(2, 4, 7, 7, seed=8, scale=2.0)
    assert_rel(forward(res.graph, x)["c"], forward(gm, x)["c"])
