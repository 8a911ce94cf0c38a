"""Deconvolution under ``--onnx-target openvino``: compiled by OpenVINO's CPU plugin, every
convolution and deconvolution that ONNX Runtime runs as an int8 kernel runs in u8/i8 in
OpenVINO (read from ``compiled.get_runtime_model()``), and the outputs are as close to the
float model's as ONNX Runtime's int8 model is.

Two nets: an FCN/U-Net-like decoder (a requantized Deconvolution → ReLU → Concat with an
encoder feature → conv, and a Deconvolution whose output is the graph's output), where
OpenVINO runs both deconvolutions in u8 although ONNX Runtime has no int8 ConvTranspose; and a
bilinear-upsampling Deconvolution (group = channels, per-tensor weights, as FCNs write it),
which neither runtime runs in int8 (OpenVINO's CPU plugin keeps a grouped deconvolution in
float whatever the weights' layout; ONNX Runtime runs a float ConvTranspose).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.algorithms.arq import arq_quantize
from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.export import export_onnx
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net, rand
from helpers.data import natural_images_bgr
from helpers.exports import minmax_records, sqnr_db
from helpers.runtimes import (
    openvino_available,
    openvino_compile,
    openvino_layers,
    ort_counts,
    ort_optimized_ops,
    ort_run,
)

pytestmark = pytest.mark.skipif(openvino_available() is not None, reason=str(openvino_available()))


def _conv(name: str, bottom: str, n: int, k: int = 3, pad: int = 1, stride: int = 1, relu: bool = True) -> str:
    s = (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
         f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} stride: {stride} }} }}\n')
    return s + (f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n' if relu else "")


def _decoder(folder) -> tuple[str, str]:
    body = (_conv("conv1", "data", 16, stride=2) + _conv("conv2", "conv1", 32, stride=2)
            + 'layer { name: "up1" type: "Deconvolution" bottom: "conv2" top: "up1" convolution_param { num_output: 16 kernel_size: 4 stride: 2 pad: 1 } }\n'
            + 'layer { name: "up1_relu" type: "ReLU" bottom: "up1" top: "up1" }\n'
            + 'layer { name: "cat" type: "Concat" bottom: "up1" bottom: "conv1" top: "cat" }\n'
            + _conv("conv3", "cat", 16)
            + 'layer { name: "up2" type: "Deconvolution" bottom: "conv3" top: "up2" convolution_param { num_output: 4 kernel_size: 2 stride: 2 } }\n')
    blobs = {"conv1": [rand(16, 3, 3, 3, seed=1, scale=0.3), rand(16, seed=2, scale=0.1)],
             "conv2": [rand(32, 16, 3, 3, seed=3, scale=0.1), rand(32, seed=4, scale=0.1)],
             "up1": [rand(32, 16, 4, 4, seed=5, scale=0.1), rand(16, seed=6, scale=0.1)],
             "conv3": [rand(16, 32, 3, 3, seed=7, scale=0.1), rand(16, seed=8, scale=0.1)],
             "up2": [rand(16, 4, 2, 2, seed=9, scale=0.2), rand(4, seed=10, scale=0.1)]}
    return make_net(folder, body, {"data": [1, 3, 64, 64]}, blobs, name="decoder")


def _bilinear(folder) -> tuple[str, str]:
    body = (_conv("conv1", "data", 16, stride=2)
            + 'layer { name: "up" type: "Deconvolution" bottom: "conv1" top: "up" convolution_param { num_output: 16 group: 16 kernel_size: 4 stride: 2 pad: 1 bias_term: false } }\n'
            + _conv("conv2", "up", 8, relu=False))
    f = np.array([0.25, 0.75, 0.75, 0.25], np.float32)
    blobs = {"conv1": [rand(16, 3, 3, 3, seed=1, scale=0.3), rand(16, seed=2, scale=0.1)],
             "up": [np.ascontiguousarray(np.outer(f, f)[None, None].repeat(16, 0))],
             "conv2": [rand(8, 16, 3, 3, seed=7, scale=0.1), rand(8, seed=8, scale=0.1)]}
    return make_net(folder, body, {"data": [1, 3, 64, 64]}, blobs, name="bilinear")


@pytest.mark.parametrize("kind", ["decoder", "bilinear"])
def test_openvino_runs_deconvolution_in_int8_where_ort_runs_int8(tmp_path, kind):
    proto, model = (_decoder if kind == "decoder" else _bilinear)(tmp_path)
    gm = fuse_bn(load_caffe(proto, model)).graph
    x = (natural_images_bgr(size=64, count=6, seed=1) / 64).astype(np.float32)
    recs = minmax_records(gm, torch.from_numpy(x[:2]))
    if kind == "bilinear":  # a grouped Deconvolution takes per-tensor weights (one ONNX axis)
        a = arq_quantize(layer_modules(gm)["up"].weight, "Deconvolution", False)
        recs["up"].scale_w, recs["up"].offset_w = a.scale_w.tolist(), [0]
    fp, ort_q = export_onnx(gm, recs, str(tmp_path / "ort"))
    _, ov_q = export_onnx(gm, recs, str(tmp_path / "ov"), target="openvino")
    compiled = openvino_compile(ov_q)
    layers = openvino_layers(compiled)
    int8 = [names for kind_, prec, names in layers if prec in ("u8", "i8")]
    deconvs = [(prec, names) for kind_, prec, names in layers if "ConvTranspose" in names or "BackpropData" in names]
    want = ort_counts(ort_q)
    assert want["conv_int8"] > 0 and len(int8) >= want["conv_int8"], (layers, want)
    ops = ort_optimized_ops(ort_q)
    if kind == "decoder":
        # every layer int8 in OpenVINO, the two deconvolutions included (ORT: float ConvTranspose)
        assert len(layers) == 5 and len(int8) == 5, layers
        assert len(deconvs) == 2 and all(p in ("u8", "i8") for p, _ in deconvs), deconvs
        assert ops["ConvTranspose"] == 2
    else:
        # the grouped deconvolution stays float in both runtimes; the convolutions are int8
        assert len(deconvs) == 1 and deconvs[0][0] not in ("u8", "i8") and ops["ConvTranspose"] == 1, (deconvs, ops)
        assert len(int8) == 2, layers
    # the numbers: as close to the float model as ORT's int8 model (within 1 dB), and close
    held = x[2:]
    ref, = ort_run(fp, held).values()
    a_, = ort_run(ort_q, held).values()
    b_ = compiled.create_infer_request().infer({0: held})[compiled.outputs[0]]
    assert b_.shape == ref.shape
    assert sqnr_db(ref, b_) >= sqnr_db(ref, a_) - 1.0 and sqnr_db(ref, b_) > 25.0, (sqnr_db(ref, a_), sqnr_db(ref, b_))
