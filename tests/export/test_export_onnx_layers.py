"""Float ONNX of every newly mapped layer type, on nets built by code: ONNX Runtime against
OpenCV's Caffe importer (≤ 1e-4 relative to the output's magnitude), or against a numpy
reference written here for the layers OpenCV does not implement (Threshold, ArgMax, Bias, Clip)
or implements with other parameters (Log base, Swish beta). The batch is symbolic: every net is
declared with batch 1 and run with batch 2."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from helpers.caffe_nets import make_net, rand, run_cv
from helpers.onnx_layers import export_and_run, rel_err
from helpers.runtimes import ort_run

X_SHAPE = [1, 4, 8, 10]
W = {"conv": [rand(6, 4, 3, 3, seed=1) * 0.3, rand(6, seed=2)]}
CONV = 'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }\n'

# OpenCV reports a slice only through a consumer
POWERS = 'layer {{ name: "t" type: "Power" bottom: "{}" top: "t" power_param {{ scale: 2 }} }}'

# (id, body, blobs, output blob); every body reads "data" (1, 4, 8, 10) or "conv" (1, 6, 8, 10)
CV_CASES = [
    ("prelu_channel", CONV + 'layer { name: "t" type: "PReLU" bottom: "conv" top: "t" }',
     {**W, "t": [rand(6, seed=5) * 0.3]}, "t"),
    ("prelu_shared", CONV + 'layer { name: "t" type: "PReLU" bottom: "conv" top: "t" prelu_param { channel_shared: true } }',
     {**W, "t": [np.array([0.17], np.float32)]}, "t"),
    ("normalize_channel", CONV + 'layer { name: "t" type: "Normalize" bottom: "conv" top: "t" norm_param { across_spatial: false channel_shared: false } }',
     {**W, "t": [np.abs(rand(6, seed=7)) * 20]}, "t"),
    ("normalize_channel_shared", CONV + 'layer { name: "t" type: "Normalize" bottom: "conv" top: "t" norm_param { across_spatial: false channel_shared: true eps: 0.001 } }',
     {**W, "t": [np.array([20.0], np.float32)]}, "t"),
    ("normalize_spatial_shared", CONV + 'layer { name: "t" type: "Normalize" bottom: "conv" top: "t" norm_param { across_spatial: true channel_shared: true } }',
     {**W, "t": [np.array([3.0], np.float32)]}, "t"),
    ("permute_flatten", 'layer { name: "p" type: "Permute" bottom: "data" top: "p" permute_param { order: 0 order: 2 order: 3 order: 1 } }\n'
     'layer { name: "t" type: "Flatten" bottom: "p" top: "t" flatten_param { axis: 1 } }', {}, "t"),
    ("flatten_mid", 'layer { name: "t" type: "Flatten" bottom: "data" top: "t" flatten_param { axis: 1 end_axis: 2 } }', {}, "t"),
    ("reshape_0_minus1", 'layer { name: "t" type: "Reshape" bottom: "data" top: "t" reshape_param { shape { dim: 0 dim: -1 dim: 5 } } }', {}, "t"),
    ("reshape_axis", 'layer { name: "t" type: "Reshape" bottom: "data" top: "t" reshape_param { axis: 1 num_axes: 1 shape { dim: 2 dim: 2 } } }', {}, "t"),
    ("softmax_class_axis", 'layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 0 dim: -1 dim: 4 } } }\n'
     'layer { name: "t" type: "Softmax" bottom: "r" top: "t" softmax_param { axis: 2 } }', {}, "t"),
    ("slice_points", 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" top: "c" slice_param { axis: 1 slice_point: 1 slice_point: 3 } }\n'
     + POWERS.format("b"), {}, "t"),
    ("slice_equal_h", 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" slice_param { axis: 2 } }\n'
     'layer { name: "u" type: "Power" bottom: "a" top: "u" }\n' + POWERS.format("b"), {}, "t"),
    ("crop", 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
     'layer { name: "t" type: "Crop" bottom: "data" bottom: "p" top: "t" crop_param { axis: 2 offset: 1 offset: 2 } }', {}, "t"),
    ("power", 'layer { name: "t" type: "Power" bottom: "data" top: "t" power_param { power: 2 scale: 0.5 shift: 3 } }', {}, "t"),
    ("power_scale_only", 'layer { name: "t" type: "Power" bottom: "data" top: "t" power_param { scale: -2 } }', {}, "t"),
    ("exp", 'layer { name: "t" type: "Exp" bottom: "data" top: "t" exp_param { base: 3 scale: 0.5 } }', {}, "t"),
    ("bnll", 'layer { name: "t" type: "BNLL" bottom: "data" top: "t" }', {}, "t"),
    ("elu", 'layer { name: "t" type: "ELU" bottom: "data" top: "t" elu_param { alpha: 0.7 } }', {}, "t"),
    ("lrn_within", 'layer { name: "t" type: "LRN" bottom: "data" top: "t" lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL alpha: 0.5 beta: 0.75 } }', {}, "t"),
    ("lrn_across", 'layer { name: "t" type: "LRN" bottom: "data" top: "t" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 } }', {}, "t"),
    ("dropout_tanh", 'layer { name: "d" type: "Dropout" bottom: "data" top: "d" }\nlayer { name: "t" type: "TanH" bottom: "d" top: "t" }', {}, "t"),
    ("pool_pad_ceil_ave", 'layer { name: "t" type: "Pooling" bottom: "data" top: "t" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }', {}, "t"),
    ("pool_ceil_max", 'layer { name: "t" type: "Pooling" bottom: "data" top: "t" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }', {}, "t"),
    ("ip_axis2", 'layer { name: "t" type: "InnerProduct" bottom: "data" top: "t" inner_product_param { num_output: 3 axis: 2 } }',
     {"t": [rand(3, 80, seed=8) * 0.1, rand(3, seed=9)]}, "t"),
]


def _x(batch: int = 2) -> np.ndarray:
    return rand(batch, *X_SHAPE[1:], seed=11)


@pytest.mark.parametrize("case", CV_CASES, ids=[c[0] for c in CV_CASES])
def test_layer_matches_opencv(tmp_path, case):
    name, body, blobs, out = case
    proto, model = make_net(tmp_path, body, {"data": X_SHAPE}, blobs)
    x = _x()
    ours, path = export_and_run(proto, model, {"data": x}, outputs=[out])
    ref = run_cv(proto, model, {"data": x}, [out])[out]
    assert ours[out].shape[0] == 2  # the batch is symbolic
    assert rel_err(ours[out], ref) <= 1e-4
    onnx.checker.check_model(onnx.load(path), full_check=True)


def _numpy_case(tmp_path, body, blobs=None, x=None):
    proto, model = make_net(tmp_path, body, {"data": X_SHAPE}, blobs or {})
    x = _x() if x is None else x
    return export_and_run(proto, model, {"data": x}, outputs=["t"])[0]["t"], x


def test_normalize_across_spatial_per_channel(tmp_path):
    """OpenCV refuses a per-channel scale with across_spatial: numpy reference."""
    w = np.abs(rand(4, seed=6)) * 20
    body = 'layer { name: "t" type: "Normalize" bottom: "data" top: "t" norm_param { across_spatial: true channel_shared: false } }'
    ours, x = _numpy_case(tmp_path, body, {"t": [w]})
    norm = np.sqrt((x.astype(np.float64) ** 2).sum(axis=(1, 2, 3), keepdims=True) + 1e-10)
    assert rel_err(ours, x / norm * w.reshape(1, -1, 1, 1)) <= 1e-5


@pytest.mark.parametrize("body,ref", [
    ('threshold_param { threshold: 0.2 }', lambda x: (x > 0.2).astype(np.float32)),
], ids=["threshold"])
def test_threshold(tmp_path, body, ref):
    ours, x = _numpy_case(tmp_path, f'layer {{ name: "t" type: "Threshold" bottom: "data" top: "t" {body} }}')
    assert np.array_equal(ours, ref(x))


@pytest.mark.parametrize("layer,ref", [
    ('type: "Clip" bottom: "data" top: "t" clip_param { min: -0.5 max: 0.7 }', lambda x, w: np.clip(x, -0.5, 0.7)),
    ('type: "Log" bottom: "data" top: "t" log_param { base: 2 shift: 6 scale: 0.5 }', lambda x, w: np.log2(6 + 0.5 * x)),
    ('type: "Swish" bottom: "data" top: "t" swish_param { beta: 1.5 }', lambda x, w: x / (1 + np.exp(-1.5 * x))),
    ('type: "Bias" bottom: "data" top: "t"', lambda x, w: x + w.reshape(1, -1, 1, 1)),
    ('type: "Bias" bottom: "data" top: "t" bias_param { axis: 2 num_axes: 2 }', lambda x, w: x + w.reshape(1, 1, 8, 10)),
    ('type: "Scale" bottom: "data" top: "t" scale_param { axis: 1 num_axes: 2 }', lambda x, w: x * w.reshape(1, 4, 8, 1)),
    ('type: "LRN" bottom: "data" top: "t" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 }',
     lambda x, w: x * (2 + 0.5 / 3 * np.stack([(x[:, max(0, c - 1):c + 2] ** 2).sum(1) for c in range(4)], 1)) ** -0.75),
], ids=["clip", "log_base2", "swish_beta", "bias_channel", "bias_hw", "scale_2axes", "lrn_k2"])
def test_elementwise_numpy(tmp_path, layer, ref):
    w = None
    blobs = {}
    if '"Bias"' in layer or '"Scale"' in layer:
        n = 4 if "axis" not in layer else (80 if "bias_param" in layer else 32)
        w = rand(n, seed=3)
        blobs = {"t": [w]}
    ours, x = _numpy_case(tmp_path, f'layer {{ name: "t" {layer} }}', blobs)
    assert rel_err(ours, ref(x.astype(np.float64), w)) <= 1e-5


def test_argmax(tmp_path):
    """With an axis: the top-k indices along it; without: per sample over everything, shaped
    (N, 2, top_k, 1) with out_max_val (indices, then values)."""
    x = _x()
    ours, _ = _numpy_case(tmp_path, 'layer { name: "t" type: "ArgMax" bottom: "data" top: "t" argmax_param { top_k: 2 axis: 1 } }', x=x)
    assert np.array_equal(ours, np.argsort(-x, axis=1, kind="stable")[:, :2].astype(np.float32))
    ours, _ = _numpy_case(tmp_path, 'layer { name: "t" type: "ArgMax" bottom: "data" top: "t" argmax_param { top_k: 3 out_max_val: true } }', x=x)
    flat = x.reshape(2, -1)
    idx = np.argsort(-flat, axis=1, kind="stable")[:, :3]
    want = np.stack([idx.astype(np.float32), np.take_along_axis(flat, idx, 1)], 1)[..., None]
    assert ours.shape == (2, 2, 3, 1) and np.array_equal(ours, want)


def test_scale_second_bottom_and_axis0_reshape(tmp_path):
    """Scale by a second bottom (squeeze-excitation style, (N, C) over axis 0) and a Reshape
    that merges the batch: numpy reference at batch 2."""
    body = ('layer { name: "g" type: "Pooling" bottom: "data" top: "g" pooling_param { pool: AVE global_pooling: true } }\n'
            'layer { name: "f" type: "Flatten" bottom: "g" top: "f" }\n'
            'layer { name: "s" type: "Sigmoid" bottom: "f" top: "s" }\n'
            'layer { name: "t" type: "Scale" bottom: "data" bottom: "s" top: "t" scale_param { axis: 0 } }')
    ours, x = _numpy_case(tmp_path, body)
    s = 1 / (1 + np.exp(-x.mean(axis=(2, 3))))
    assert rel_err(ours, x * s[:, :, None, None]) <= 1e-5
    ours, x = _numpy_case(tmp_path, 'layer { name: "t" type: "Reshape" bottom: "data" top: "t" reshape_param { shape { dim: -1 dim: 10 } } }')
    assert ours.shape == (64, 10) and np.array_equal(ours, x.reshape(-1, 10))


def test_fake_quant_model_file_exports(tmp_path):
    """A fake-quant model amct_torch wrote, loaded back, exports too (Quant → Q/DQ, DeQuant →
    Identity): ORT equals the loaded model except for a value on a rounding tie; the deploy
    model's integer layers are refused with a message naming the layer."""
    import torch

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.errors import ExportError
    from amct_torch.export import save_quant_models
    from amct_torch.export.onnx.qdq import export_float_onnx
    from helpers.exports import SMALL_BODY, minmax_records, small_blobs
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    x = rand(4, 3, 8, 8, seed=2)
    gm = load_caffe(proto, model)
    save_quant_models(gm, minmax_records(gm, torch.from_numpy(x)), save_path=str(tmp_path / "q"))
    fq_p, fq_m = str(tmp_path / "q_fake_quant_model.prototxt"), str(tmp_path / "q_fake_quant_weights.caffemodel")
    _, path = export_and_run(fq_p, fq_m, {"data": x})
    # with optimizations ORT fuses DQ → Conv(float weights) → Q into QLinearConv and quantizes
    # the float weights itself (per tensor): other numbers (docs/export.md)
    ours = ort_run(path, x, "DISABLE_ALL", outputs=["fc1"])["fc1"]
    with torch.no_grad():
        want = load_caffe(fq_p, fq_m)(torch.from_numpy(x))["fc1"].numpy()
    assert (np.abs(ours - want) <= 1e-4 * np.abs(want).max()).mean() >= 0.95
    dep = load_caffe(str(tmp_path / "q_deploy_model.prototxt"), str(tmp_path / "q_deploy_weights.caffemodel"))
    with pytest.raises(ExportError) as err:
        export_float_onnx(dep, str(tmp_path / "d.onnx"))
    assert "_quant_layer" in str(err.value) and "deploy" in str(err.value)
