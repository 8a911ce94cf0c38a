"""Real deploy prototxts of public repositories (tests/caffe/data: SqueezeNet v1.1, GilLevi's age
net, DenseNet-121's stem with ``ceil_mode: false``, HED with its five Crop layers named "crop",
FCN-8s, VDSR, colorization ending with Silence, MobileNetV3's SE stem) with weights built by
code: our float outputs against OpenCV's Caffe importer on every output blob, and ``inspect``
finds nothing unsupported; two go through ``calibrate --onnx`` (slow).

Reference: OpenCV 4.x ``readNetFromCaffe`` (DepthwiseConvolution given to it as the Convolution
whose forward it shares); ONNX Runtime for the exported float model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from helpers.real_nets import code_weights, opencv_outputs, real_prototxt, rel_diff, sized_copy
from helpers.runtimes import ort_counts, ort_run

#: name -> (input size, or None for the file's own)
NETS = {"squeezenet11": 96, "age": None, "densenet121_stem": None, "hed": 96, "fcn8s": 96,
        "vdsr": 48, "colorization": 64, "mobilenetv3_se_stem": None}
RENAMES = {"DepthwiseConvolution": "Convolution"}
SLOW = {"fcn8s", "colorization"}  # VGG-sized: 15-70 s on a busy 2-core machine


def _prepared(tmp_path, name):
    proto = real_prototxt(name)
    size = NETS[name]
    if size is not None:
        proto = sized_copy(proto, tmp_path, size)
    return proto, code_weights(proto, tmp_path)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(NETS)])
def test_float_outputs_match_opencv(tmp_path, capsys, name):
    proto, model = _prepared(tmp_path, name)
    gm = load_caffe(proto, model)
    (inp, shape), = gm.caffe_inputs
    x = np.random.default_rng(3).standard_normal([1] + list(shape[1:])).astype(np.float32)
    with torch.no_grad():
        ours = {k: v.numpy() for k, v in gm(torch.from_numpy(x)).items()}
    ref = opencv_outputs(proto, model, {inp: x}, list(ours), tmp_path, RENAMES)
    for k in ours:
        assert rel_diff(ours[k], ref[k]) < 1e-3, k  # float32 sums in another order (measured: up to 4e-4)
    assert main(["inspect", proto, model, "--no-onnx"]) == 0
    capsys.readouterr()


def test_densenet_pool1_is_56(tmp_path):
    gm = load_caffe(real_prototxt("densenet121_stem"))
    shapes = {n.meta.get("caffe_layer"): n.meta.get("caffe_shape") for n in gm.graph.nodes}
    assert shapes["pool1"] == (1, 64, 56, 56)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hed", "colorization"])
def test_calibrate_onnx(tmp_path, capsys, name):
    """HED (shared Crop names, four Deconvolutions) and colorization (Silence): calibrate
    --onnx on the default config; the float ONNX model computes ours, every convolution is int8
    in ONNX Runtime and only the Deconvolutions stay float (named in the summary)."""
    proto, model = _prepared(tmp_path, name)
    gm = load_caffe(proto, model)
    (inp, shape), = gm.caffe_inputs
    rng = np.random.default_rng(4)
    data = str(tmp_path / "calib.npy")
    np.save(data, rng.standard_normal([4] + list(shape[1:])).astype(np.float32))
    out = str(tmp_path / "o" / "m")
    assert main(["calibrate", proto, model, data, "-o", out, "--onnx", "--report-batches", "0"]) == 0
    summary = capsys.readouterr().out
    x = rng.standard_normal([1] + list(shape[1:])).astype(np.float32)
    with torch.no_grad():
        ours = {k: v.numpy() for k, v in gm(torch.from_numpy(x)).items()}
    got = ort_run(out + "_float.onnx", x, level="DISABLE_ALL")
    assert sorted(got) == sorted(ours)
    for k in ours:
        assert rel_diff(got[k], ours[k]) < 1e-4
    counts = ort_counts(out + "_quant.onnx")
    assert counts["conv_float"] == 0 and counts["fc_float"] == 0
    deconvs = sum(1 for n in gm.graph.nodes if n.meta.get("caffe_type") == "Deconvolution")
    assert summary.count("runs in float in ONNX Runtime") == deconvs
