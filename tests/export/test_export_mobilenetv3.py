"""MobileNetV3 as a Caffe port writes it (eric612/MobilenetV3-Caffe: DepthwiseConvolution,
ReLU6/Power hard-swish, squeeze-excitation with InnerProducts on a pooled 4-D blob and a
``Scale`` with two bottoms): every InnerProduct runs in an int8 kernel of ONNX Runtime, the
ones behind a Flatten included.

References: OpenCV's Caffe importer for the float net (DepthwiseConvolution given to it as the
Convolution whose forward it shares), the torch fake-quant model for the QDQ model, and ONNX
Runtime's own optimized graph for which kernels run."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from helpers.exports import sqnr_db
from helpers.real_nets import code_weights, opencv_outputs, real_prototxt, rel_diff
from helpers.runtimes import ort_counts, ort_run


def test_se_block_inner_products_run_int8(tmp_path, capsys):
    proto = real_prototxt("mobilenetv3_se_stem")
    model = code_weights(proto, tmp_path)
    x = np.random.default_rng(7).standard_normal((1, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        ours = load_caffe(proto, model)(torch.from_numpy(x))["head_fc"].numpy()
    ref = opencv_outputs(proto, model, {"blob1": x}, ["head_fc"], tmp_path,
                         {"DepthwiseConvolution": "Convolution"})["head_fc"]
    assert rel_diff(ours, ref) < 1e-4
    data = str(tmp_path / "calib.npy")
    np.save(data, np.random.default_rng(8).standard_normal((4, 3, 64, 64)).astype(np.float32))
    out = str(tmp_path / "o" / "m")
    assert main(["calibrate", "-q", proto, model, data, "-o", out, "--onnx", "--report-batches", "0"]) == 0
    capsys.readouterr()
    counts = ort_counts(out + "_quant.onnx")
    assert counts == {"conv_int8": 12, "conv_float": 0, "fc_int8": 3, "fc_float": 0}, counts
    # ORT's int8 kernels compute the fake-quant model (up to their own requantization)
    with torch.no_grad():
        fq = load_caffe(out + "_fake_quant_model.prototxt", out + "_fake_quant_weights.caffemodel")
        want = fq(torch.from_numpy(x))["head_fc"].numpy()
    got = ort_run(out + "_quant.onnx", x)["head_fc"]
    assert sqnr_db(want, got) > 30
    assert rel_diff(ort_run(out + "_float.onnx", x, level="DISABLE_ALL")["head_fc"], ours) < 1e-4
