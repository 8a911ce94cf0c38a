"""A grouped Deconvolution with per-channel weights (the default config) exports: along axis 0
when each group has one output channel (FCN/SegNet bilinear upsampling, group = channels),
else as its dequantized float weights; the calibrate summary and ``inspect`` name the
Deconvolutions ONNX Runtime runs in float.

References: the torch fake-quant model run by ONNX Runtime with graph optimizations off (the
QDQ model computed node by node), the weights' values written out plainly (int8 code × the
scale of its output channel) and ONNX Runtime's own optimized graph."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.export.onnx.ort_float import dequantized_grouped_deconv, grouped_deconv_row_scales
from amct_torch.record import read_record
from helpers.caffe_nets import make_net, rand
from helpers.exports import sqnr_db
from helpers.runtimes import ort_optimized_ops, ort_run


def _net(tmp_path, group: int, c_out: int):
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
            'convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n'
            f'layer {{ name: "up" type: "Deconvolution" bottom: "conv" top: "up" convolution_param '
            f'{{ num_output: {c_out} kernel_size: 4 stride: 2 pad: 1 group: {group} }} }}\n')
    blobs = {"conv": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)],
             "up": [rand(4, c_out // group, 4, 4, seed=3) * np.linspace(0.2, 3, c_out // group * 4 * 16,
                                                                   dtype=np.float32).reshape(4, c_out // group, 4, 4),
                    rand(c_out, seed=4)]}
    return make_net(tmp_path, body, {"data": [1, 3, 8, 8]}, blobs)


@pytest.mark.parametrize("group,c_out", [(4, 4), (2, 4), (4, 8)])
def test_grouped_per_channel_deconvolution_exports(tmp_path, capsys, group, c_out):
    proto, model = _net(tmp_path, group, c_out)
    data = str(tmp_path / "calib.npy")
    np.save(data, rand(4, 3, 8, 8, seed=5))
    out = str(tmp_path / "o" / "m")
    assert main(["calibrate", proto, model, data, "-o", out, "--onnx", "--report-batches", "0"]) == 0
    summary = capsys.readouterr().out
    rec = read_record(out + "_record.txt")["up"]
    assert len(rec.scale_w) == c_out  # per channel, as the default config asks
    assert "onnx: 'up' runs in float in ONNX Runtime" in summary
    one_per_group = c_out == group
    assert ("no single ONNX quantization axis" in summary) == (not one_per_group)
    # the weight as written: int8 along axis 0 with one scale per row, or float values
    m = onnx.load(out + "_quant.onnx")
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    w_int8 = np.asarray(load_caffe(out + "_deploy_model.prototxt", out + "_deploy_weights.caffemodel")
                        .get_submodule("up").weight).astype(np.int8)
    sw = np.asarray(rec.scale_w, np.float32)
    opg = c_out // group
    expect = np.stack([w_int8[i].astype(np.float32) * sw[(i // (4 // group)) * opg:(i // (4 // group) + 1) * opg,
                                                         None, None] for i in range(4)])
    if one_per_group:
        assert np.array_equal(inits["up_weight_int8"], w_int8)
        scales = inits["up_weight_scale"]
        assert np.array_equal(scales, np.repeat(sw, 4 // group))
        dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "up_weight_int8")
        assert [a.i for a in dq.attribute if a.name == "axis"] == [0]
        assert np.array_equal(inits["up_weight_int8"].astype(np.float32) * scales[:, None, None, None], expect)
    else:
        assert "up_weight_int8" not in inits and np.array_equal(inits["up_weight"], expect)
    # ORT node by node computes the torch fake-quant model; optimized, the conv is int8 and the
    # deconvolution a float ConvTranspose
    x = rand(1, 3, 8, 8, seed=6)
    fq = load_caffe(out + "_fake_quant_model.prototxt", out + "_fake_quant_weights.caffemodel")
    with torch.no_grad():
        ref = fq(torch.from_numpy(x))["up"].numpy()
    got = ort_run(out + "_quant.onnx", x, level="DISABLE_ALL")["up"]
    assert sqnr_db(ref, got) > 80
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert ops["ConvTranspose"] == 1 and ops["Conv"] == 0
    assert ops["QLinearConv"] + ops["ConvInteger"] == 1


def test_row_scales_and_dequantized_weights_by_hand():
    """group 2, C_in 4, one output channel per group: rows 0, 1 take scale 0, rows 2, 3 scale 1;
    two output channels per group: no axis, and the float weights are code × the scale of
    (group, column)."""
    assert np.array_equal(grouped_deconv_row_scales(np.array([0.5, 2.0]), (4, 1, 2, 2), 2),
                          [0.5, 0.5, 2.0, 2.0])
    assert grouped_deconv_row_scales(np.array([1, 2, 3, 4.0]), (4, 2, 2, 2), 2) is None
    w = np.arange(4 * 2, dtype=np.int8).reshape(4, 2, 1, 1)
    got = dequantized_grouped_deconv(w, np.array([1.0, 10.0, 100.0, 1000.0]), 2)[:, :, 0, 0]
    assert got.tolist() == [[0, 10], [2, 30], [400, 5000], [600, 7000]]


def test_inspect_lists_the_float_deconvolution(tmp_path, capsys):
    proto, _ = _net(tmp_path, 2, 4)
    assert main(["inspect", proto]) == 0
    text = capsys.readouterr().out
    assert "ORT float    1 quantized layer(s)" in text and "layer 'up'" in text
