"""ONNX export of the mobile / YOLO / SegNet forks' layer types, on nets built by code.

Float ONNX: ONNX Runtime against the torch modules (themselves checked against OpenCV or the
forks' loops in tests/caffe/test_caffe_layers_forks_mobile.py) to 1e-4 relative, and against
OpenCV directly where OpenCV implements the type with the fork's parameters. Every net is
declared with batch 1 and run with batch 2 (the batch stays symbolic).

QDQ: small nets shaped like MobileNet-YOLO (ConvolutionDepthwise + BN + Scale + ReLU6, an SE
block with HardSigmoid and Axpy, Upsample + Concat), a ShuffleNet unit and a SegNet
encoder-decoder go through calibration with ``--onnx``: the depthwise layers get per-channel
record entries, the QDQ model loads in ONNX Runtime, every quantized convolution (depthwise
included) runs as an int8 kernel, and the model computes the torch fake-quant model.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.caffe.netio import read_net
from amct_torch.cli import main
from amct_torch.export import fake_quant_graph
from amct_torch.fusion import fuse_bn
from amct_torch.record import read_record
from helpers.caffe_nets import make_net, rand, run_cv, run_ours
from helpers.exports import sqnr_db
from helpers.onnx_layers import export_and_run, rel_err
from helpers.runtimes import ORT_INT8_CONV, ort_optimized_ops, ort_run

X = [1, 6, 9, 11]

DW_W = {"t": [rand(6, 1, 3, 3, seed=1) * 0.5, rand(6, seed=2)]}
DW_W_NB = {"t": [rand(6, 1, 3, 5, seed=3) * 0.5]}
BN2 = {"t": [rand(1, 6, 1, 1, seed=4), rand(1, 6, 1, 1, seed=5)]}
BN4 = {"t": [rand(1, 6, 1, 1, seed=6), rand(1, 6, 1, 1, seed=7), rand(1, 6, 1, 1, seed=8),
             np.abs(rand(1, 6, 1, 1, seed=9)) + 0.1]}
POOL_MASK = ('layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" '
             'pooling_param {{ pool: MAX {pool} }} }}\n'
             'layer {{ name: "t" type: "Upsample" bottom: "pool" bottom: "mask" top: "t" upsample_param {{ {up} }} }}')
AXPY = ('layer {{ name: "a" type: "Pooling" bottom: "data" top: "a" pooling_param {{ pool: AVE global_pooling: true }} }}\n'
        'layer {{ name: "s" type: "HardSigmoid" bottom: "a" top: "s" }}\n{flat}'
        'layer {{ name: "y" type: "ReLU6" bottom: "data" top: "y" }}\n'
        'layer {{ name: "t" type: "Axpy" bottom: "{scale}" bottom: "data" bottom: "y" top: "t" }}')

# (id, body, blobs, checked against OpenCV too)
CASES = [
    ("convdw_k3_s2", 'layer { name: "t" type: "ConvolutionDepthwise" bottom: "data" top: "t" convolution_param { num_output: 6 kernel_size: 3 pad: 1 stride: 2 } }', DW_W, True),
    ("convdw_k3x5_dil", 'layer { name: "t" type: "ConvolutionDepthwise" bottom: "data" top: "t" convolution_param { num_output: 6 kernel_h: 3 kernel_w: 5 pad_h: 2 pad_w: 1 dilation: 2 bias_term: false } }', DW_W_NB, True),
    ("dwconv_group", 'layer { name: "t" type: "DepthwiseConvolution" bottom: "data" top: "t" convolution_param { num_output: 6 group: 6 kernel_size: 3 stride: 2 } }', DW_W, False),
    ("shuffle_g3", 'layer { name: "t" type: "ShuffleChannel" bottom: "data" top: "t" shuffle_channel_param { group: 3 } }', {}, True),
    ("shuffle_g2", 'layer { name: "t" type: "ShuffleChannel" bottom: "data" top: "t" shuffle_channel_param { group: 2 } }', {}, True),
    ("relu6", 'layer { name: "t" type: "ReLU6" bottom: "data" top: "t" }', {}, True),
    ("relu6_slope_thr", 'layer { name: "t" type: "ReLU6" bottom: "data" top: "t" relu6_param { negative_slope: 0.1 threshold: 2 } }', {}, False),
    ("relu6_negative_thr", 'layer { name: "t" type: "ReLU6" bottom: "data" top: "t" relu6_param { threshold: -0.5 } }', {}, False),
    ("hardswish", 'layer { name: "t" type: "HardSwish" bottom: "data" top: "t" }', {}, True),
    ("hardsigmoid", 'layer { name: "t" type: "HardSigmoid" bottom: "data" top: "t" }', {}, True),
    ("hardsigmoid_params", 'layer { name: "t" type: "HardSigmoid" bottom: "data" top: "t" hardsigmoid_param { alpha: 0.3 beta: 0.4 } }', {}, True),
    ("axpy_4d", AXPY.format(flat="", scale="s"), {}, False),
    ("axpy_2d", AXPY.format(flat='layer { name: "f" type: "Flatten" bottom: "s" top: "f" }\n', scale="f"), {}, False),
    ("upsample_2", 'layer { name: "t" type: "Upsample" bottom: "data" top: "t" upsample_param { scale: 2 } }', {}, False),
    ("upsample_3", 'layer { name: "t" type: "Upsample" bottom: "data" top: "t" upsample_param { scale: 3 } }', {}, False),
    ("upsample_1", 'layer { name: "t" type: "Upsample" bottom: "data" top: "t" }', {}, False),
    ("unpool_k2_pad_out", POOL_MASK.format(pool="kernel_size: 2 stride: 2", up="scale: 2 pad_out_h: true pad_out_w: true"), {}, False),
    ("unpool_k3s2_overlap", POOL_MASK.format(pool="kernel_size: 3 stride: 2 pad: 1", up="upsample_h: 9 upsample_w: 11"), {}, False),
    ("unpool_k3s3", POOL_MASK.format(pool="kernel_size: 3 stride: 3", up="scale_h: 3 scale_w: 3"), {}, False),
    ("unpool_global", POOL_MASK.format(pool="global_pooling: true", up="upsample_h: 9 upsample_w: 11"), {}, False),
    ("bn_segnet_inference", 'layer { name: "t" type: "BN" bottom: "data" top: "t" bn_param { bn_mode: INFERENCE } }', BN2, False),
    ("bn_segnet_learn", 'layer { name: "t" type: "BN" bottom: "data" top: "t" }', BN2, False),
    ("bn_pspnet", 'layer { name: "t" type: "BN" bottom: "data" top: "t" bn_param { eps: 0.001 } }', BN4, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float_onnx_matches_torch_and_opencv(tmp_path, case):
    _, body, blobs, cv = case
    proto, model = make_net(tmp_path, body, {"data": X}, blobs)
    x = rand(2, *X[1:], seed=10, scale=4.0)
    x[0, 0, 0, :3] = 5.0  # pooling ties
    got, path = export_and_run(proto, model, {"data": x})
    onnx.checker.check_model(onnx.load(path), full_check=True)
    ours = run_ours(proto, model, x)["t"]
    assert rel_err(got["t"], ours) <= 1e-4
    if cv:
        ref = np.concatenate([run_cv(proto, model, {"data": x[i:i + 1]}, ["t"])["t"] for i in range(2)])
        assert rel_err(got["t"], ref) <= 1e-4


def test_pool_mask_top_exported_as_maxpool_indices(tmp_path):
    """The mask itself as an output: Caffe's per-plane h * W + w (MaxPool's Indices mod H*W)."""
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }\n'
            'layer { name: "t" type: "Power" bottom: "mask" top: "t" }')
    proto, model = make_net(tmp_path, body, {"data": X})
    x = rand(2, *X[1:], seed=11)
    got, _ = export_and_run(proto, model, {"data": x})
    np.testing.assert_array_equal(got["t"], run_ours(proto, model, x)["t"])
    np.testing.assert_array_equal(got["pool"], run_ours(proto, model, x)["pool"])


# -- quantized, end to end ---------------------------------------------------------------------
def _cbr(name, bottom, c, k=3, pad=1, stride=1, kind="Convolution", extra="", act="ReLU6"):
    """Convolution-type layer + BatchNorm + Scale + activation, in place as the forks write them."""
    return (f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {c} kernel_size: {k} pad: {pad} stride: {stride} bias_term: false {extra} }} }}\n'
            f'layer {{ name: "{name}_bn" type: "BatchNorm" bottom: "{name}" top: "{name}" batch_norm_param {{ use_global_stats: true }} }}\n'
            f'layer {{ name: "{name}_scale" type: "Scale" bottom: "{name}" top: "{name}" scale_param {{ bias_term: true }} }}\n'
            f'layer {{ name: "{name}_act" type: "{act}" bottom: "{name}" top: "{name}" }}\n')


def _cbr_blobs(rng, name, cout, cin_per_group, k, blobs):
    blobs[name] = [rng.standard_normal((cout, cin_per_group, k, k)).astype(np.float32) / np.sqrt(cin_per_group * k * k)]
    blobs[name + "_bn"] = [rng.standard_normal(cout).astype(np.float32) * 0.1,
                           (rng.random(cout) + 0.5).astype(np.float32), np.array([1.0], np.float32)]
    blobs[name + "_scale"] = [(rng.random(cout) + 0.5).astype(np.float32),
                              rng.standard_normal(cout).astype(np.float32) * 0.1]


def mobilenet_yolo(folder):
    """MobileNet-YOLO in small: depthwise separable blocks (both depthwise types), an SE block
    (HardSigmoid + Axpy), HardSwish, a nearest Upsample concatenated with an earlier map."""
    rng = np.random.default_rng(0)
    blobs: dict = {}
    body = _cbr("c0", "data", 8, stride=2)
    _cbr_blobs(rng, "c0", 8, 3, 3, blobs)
    body += _cbr("dw1", "c0", 8, kind="ConvolutionDepthwise")
    _cbr_blobs(rng, "dw1", 8, 1, 3, blobs)
    body += _cbr("pw1", "dw1", 16, k=1, pad=0, act="HardSwish")
    _cbr_blobs(rng, "pw1", 16, 8, 1, blobs)
    body += _cbr("dw2", "pw1", 16, stride=2, kind="DepthwiseConvolution", extra="group: 16")
    _cbr_blobs(rng, "dw2", 16, 1, 3, blobs)
    body += _cbr("pw2", "dw2", 16, k=1, pad=0)
    _cbr_blobs(rng, "pw2", 16, 16, 1, blobs)
    body += ('layer { name: "se_pool" type: "Pooling" bottom: "pw2" top: "se_pool" pooling_param { pool: AVE global_pooling: true } }\n'
             'layer { name: "se_fc1" type: "Convolution" bottom: "se_pool" top: "se_fc1" convolution_param { num_output: 4 kernel_size: 1 } }\n'
             'layer { name: "se_relu" type: "ReLU" bottom: "se_fc1" top: "se_fc1" }\n'
             'layer { name: "se_fc2" type: "Convolution" bottom: "se_fc1" top: "se_fc2" convolution_param { num_output: 16 kernel_size: 1 } }\n'
             'layer { name: "se_gate" type: "HardSigmoid" bottom: "se_fc2" top: "se_gate" }\n'
             'layer { name: "se" type: "Axpy" bottom: "se_gate" bottom: "pw2" bottom: "pw2" top: "se" }\n'
             'layer { name: "up" type: "Upsample" bottom: "se" top: "up" upsample_param { scale: 2 } }\n'
             'layer { name: "cat" type: "Concat" bottom: "up" bottom: "pw1" top: "cat" }\n'
             'layer { name: "head" type: "Convolution" bottom: "cat" top: "head" convolution_param { num_output: 12 kernel_size: 1 } }\n')
    blobs["se_fc1"] = [rng.standard_normal((4, 16, 1, 1)).astype(np.float32) * 0.3, np.zeros(4, np.float32)]
    blobs["se_fc2"] = [rng.standard_normal((16, 4, 1, 1)).astype(np.float32) * 0.3, np.zeros(16, np.float32)]
    blobs["head"] = [rng.standard_normal((12, 32, 1, 1)).astype(np.float32) * 0.2,
                     rng.standard_normal(12).astype(np.float32) * 0.1]
    return make_net(folder, body, {"data": [1, 3, 31, 39]}, blobs, name="mnyolo")


def shufflenet_unit(folder):
    """A ShuffleNet v1 stride-2 unit: grouped 1x1, ShuffleChannel, ConvolutionDepthwise, grouped
    1x1, concatenated with an AVE-pooled shortcut."""
    rng = np.random.default_rng(1)
    blobs: dict = {}
    body = _cbr("c0", "data", 12, stride=2, act="ReLU")
    _cbr_blobs(rng, "c0", 12, 3, 3, blobs)
    body += _cbr("g1", "c0", 12, k=1, pad=0, extra="group: 3", act="ReLU")
    _cbr_blobs(rng, "g1", 12, 4, 1, blobs)
    body += 'layer { name: "shuffle" type: "ShuffleChannel" bottom: "g1" top: "shuffle" shuffle_channel_param { group: 3 } }\n'
    body += _cbr("dw", "shuffle", 12, stride=2, kind="ConvolutionDepthwise", act="ReLU6")
    _cbr_blobs(rng, "dw", 12, 1, 3, blobs)
    body += _cbr("g2", "dw", 12, k=1, pad=0, extra="group: 3", act="ReLU")
    _cbr_blobs(rng, "g2", 12, 4, 1, blobs)
    body += ('layer { name: "short" type: "Pooling" bottom: "c0" top: "short" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }\n'
             'layer { name: "cat" type: "Concat" bottom: "short" bottom: "g2" top: "cat" }\n'
             'layer { name: "fc" type: "Convolution" bottom: "cat" top: "fc" convolution_param { num_output: 5 kernel_size: 1 } }\n')
    blobs["fc"] = [rng.standard_normal((5, 24, 1, 1)).astype(np.float32) * 0.2, np.zeros(5, np.float32)]
    return make_net(folder, body, {"data": [1, 3, 29, 33]}, blobs, name="shufflenet")


def segnet(folder):
    """SegNet in small: conv + SegNet BN (INFERENCE) + ReLU, MAX pooling with its mask, a
    decoder Upsample with the mask, convolutions on the unpooled map; an odd size (pad_out)."""
    rng = np.random.default_rng(2)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    body = ('layer { name: "e1" type: "Convolution" bottom: "data" top: "e1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "e1_bn" type: "BN" bottom: "e1" top: "e1" bn_param { bn_mode: INFERENCE } }\n'
            'layer { name: "e1_relu" type: "ReLU" bottom: "e1" top: "e1" }\n'
            'layer { name: "pool1" type: "Pooling" bottom: "e1" top: "pool1" top: "pool1_mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            'layer { name: "e2" type: "Convolution" bottom: "pool1" top: "e2" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "e2_bn" type: "BN" bottom: "e2" top: "e2" bn_param { bn_mode: INFERENCE } }\n'
            'layer { name: "e2_relu" type: "ReLU" bottom: "e2" top: "e2" }\n'
            'layer { name: "up1" type: "Upsample" bottom: "e2" bottom: "pool1_mask" top: "up1" upsample_param { scale: 2 pad_out_h: true } }\n'
            'layer { name: "d1" type: "Convolution" bottom: "up1" top: "d1" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n')
    blobs = {"e1": [f(8, 3, 3, 3) * 0.3, f(8) * 0.1], "e1_bn": [np.abs(f(1, 8, 1, 1)) + 0.5, f(1, 8, 1, 1) * 0.1],
             "e2": [f(8, 8, 3, 3) * 0.15, f(8) * 0.1], "e2_bn": [np.abs(f(1, 8, 1, 1)) + 0.5, f(1, 8, 1, 1) * 0.1],
             "d1": [f(4, 8, 3, 3) * 0.15, f(4) * 0.1]}
    return make_net(folder, body, {"data": [1, 3, 17, 20]}, blobs, name="segnet")


def _check_quantized(proto, model, out, dw_layers, quantized_convs, output, min_sqnr=30.0):
    recs = read_record(out + "_record.txt")
    mods = layer_modules(load_caffe(proto, model))
    for name in dw_layers:  # per-channel weight factors, as for a Convolution
        assert len(recs[name].scale_w) == mods[name].weight.shape[0] > 1, name
    model_q = onnx.load(out + "_quant.onnx")
    onnx.checker.check_model(model_q, full_check=True)
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert sum(ops[k] for k in ORT_INT8_CONV) == quantized_convs, ops
    assert ops["Conv"] + ops["FusedConv"] == 0, ops
    # the QDQ model computes the torch fake-quant model (unoptimised: float rounding apart)
    gm = fuse_bn(load_caffe(proto, model)).graph
    x = rand(2, *gm.caffe_inputs[0][1][1:], seed=21, scale=2.0)
    with torch.no_grad():
        want = fake_quant_graph(gm, recs)(torch.from_numpy(x))[output].numpy()
    got = ort_run(out + "_quant.onnx", x, "DISABLE_ALL")[output]
    off = np.abs(got - want) > 1e-4 * np.abs(want).max()
    assert off.mean() <= 0.01, off.mean()
    # ORT's int8 kernels requantize with a float multiplier: codes move by one step near ties,
    # and behind a MAX pooling mask a moved code can move a value to another position
    fast = ort_run(out + "_quant.onnx", x)[output]
    sqnr = sqnr_db(want, fast)
    assert sqnr >= min_sqnr, sqnr
    # the Caffe outputs keep the user's types and parameters (BatchNorm/Scale are folded; a
    # folded convolution gains bias_term)
    src = {l.name: l for l in read_net(proto).net.layer}
    for kind in ("fake_quant_model", "deploy_model"):
        written = {l.name: l for l in read_net(f"{out}_{kind}.prototxt").net.layer}
        for name, layer in src.items():
            if layer.type in ("BatchNorm", "Scale", "Input"):
                continue
            w = written[name]
            assert w.type == layer.type, (kind, name)
            for f in _FORK_PARAMS:
                a, b = getattr(layer, f), getattr(w, f)
                if f == "convolution_param":
                    a, b = type(a)(), type(b)()
                    a.CopyFrom(getattr(layer, f))
                    b.CopyFrom(getattr(w, f))
                    a.ClearField("bias_term")
                    b.ClearField("bias_term")
                assert a == b, (kind, name, f)
    return recs


_FORK_PARAMS = ("convolution_param", "bn_param", "relu6_param", "shuffle_channel_param",
                "hardsigmoid_param", "upsample_param", "pooling_param")


def test_mobilenet_yolo_calibrate_onnx_cli(tmp_path, capsys):
    proto, model = mobilenet_yolo(tmp_path)
    data = tmp_path / "calib.npy"
    np.save(data, rand(8, 3, 31, 39, seed=3, scale=2.0))
    out = str(tmp_path / "out" / "mnyolo")
    assert main(["calibrate", "-q", proto, model, str(data), "-o", out, "--onnx", "--batch-num", "2",
                 "--device", "cpu", "--report-batches", "1"]) == 0
    capsys.readouterr()
    recs = _check_quantized(proto, model, out, ["dw1", "dw2"], 8, "head")
    assert set(recs) == {"c0", "dw1", "pw1", "dw2", "pw2", "se_fc1", "se_fc2", "head"}
    report = open(out + "_layer_report.json").read()
    assert '"dw1"' in report and '"dw2"' in report


def test_shufflenet_unit_quantize_onnx(tmp_path):
    import amct_torch
    proto, model = shufflenet_unit(tmp_path)
    out = str(tmp_path / "out" / "shufflenet")
    amct_torch.quantize(proto, model, rand(8, 3, 29, 33, seed=4, scale=2.0), output=out, batch_num=2,
                        onnx=True, quiet=True, device="cpu", report=False)
    recs = _check_quantized(proto, model, out, ["dw"], 5, "fc")
    assert "short" in recs  # the AVE shortcut pooling is quantized too


def test_segnet_quantize_onnx(tmp_path):
    import amct_torch
    proto, model = segnet(tmp_path)
    out = str(tmp_path / "out" / "segnet")
    amct_torch.quantize(proto, model, rand(8, 3, 17, 20, seed=5, scale=2.0), output=out, batch_num=2,
                        onnx=True, quiet=True, device="cpu", report=False)
    _check_quantized(proto, model, out, [], 3, "d1", min_sqnr=20.0)
    assert os.path.exists(out + "_float.onnx")


def test_depthwise_without_num_output_calibrates_per_channel_and_converts(tmp_path):
    """The ConvolutionDepthwise fork reads no num_output: a prototxt without it still gets one
    weight factor per channel (sized by the weights), and ``convert`` accepts that record; the
    scales are ARQ's per-channel max|w| / 127."""
    import amct_torch
    from amct_torch.record import read_record

    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    wd = (rng.standard_normal((6, 1, 3, 3)) * np.linspace(0.1, 3, 6).reshape(6, 1, 1, 1)).astype(np.float32)
    body = ('layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" '
            'convolution_param { num_output: 6 kernel_size: 3 bias_term: false } }\n'
            'layer { name: "dw" type: "ConvolutionDepthwise" bottom: "c1" top: "dw" '
            'convolution_param { kernel_size: 3 pad: 1 bias_term: false } }\n')
    proto, model = make_net(tmp_path, body, {"data": [2, 3, 15, 13]}, {"c1": [w1], "dw": [wd]})
    out = str(tmp_path / "o" / "m")
    amct_torch.quantize(proto, model, rand(4, 3, 15, 13, seed=6), output=out, batch_num=2,
                        report=False, quiet=True)
    rec = read_record(out + "_record.txt")["dw"]
    assert len(rec.scale_w) == 6
    # ARQ per channel (docs/algorithms.md, "ARQ"): v = the signed extreme of larger magnitude,
    # scale_w = v/127 if v > 0 else |v|/128
    rows = wd.reshape(6, -1).astype(np.float64)
    v = np.where(rows.max(1) > -rows.min(1), rows.max(1), rows.min(1))
    np.testing.assert_allclose(rec.scale_w, np.where(v > 0, v / 127, -v / 128), rtol=1e-5)
    amct_torch.convert_model(proto, model, out + "_record.txt", str(tmp_path / "c" / "m"))
    assert os.path.exists(str(tmp_path / "c" / "m_deploy_model.prototxt"))
