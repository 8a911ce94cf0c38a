"""A face-cascade style pair of PReLU nets (MTCNN-like): the fully convolutional proposal net
(conv + PReLU + ceil-mode max pool, two heads with Softmax over the channels) exports with a
symbolic batch AND spatial size, and runs at two image-pyramid sizes against OpenCV; the
refinement net (conv + PReLU + pool + FC + PReLU + FC + Softmax, Dropout) has a fixed 24×24
input and runs at batch 5. The QDQ models run in ORT with the fake-quant model's numbers."""
from __future__ import annotations

import numpy as np
import onnx
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.export import export_onnx, fake_quant_graph
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net, rand, run_cv
from helpers.exports import minmax_records
from helpers.onnx_layers import export_and_run, rel_err
from helpers.runtimes import ort_run, ort_session


def _conv(name, bottom, n, k, s=1):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} stride: {s} }} }}\n'
            f'layer {{ name: "{name}_prelu" type: "PReLU" bottom: "{name}" top: "{name}" }}\n')


def pnet(tmp_path):
    body = (_conv("conv1", "data", 10, 3)
            + 'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            + _conv("conv2", "pool1", 16, 3) + _conv("conv3", "conv2", 32, 3)
            + 'layer { name: "cls" type: "Convolution" bottom: "conv3" top: "cls" convolution_param { num_output: 2 kernel_size: 1 } }\n'
            + 'layer { name: "prob" type: "Softmax" bottom: "cls" top: "prob" }\n'
            + 'layer { name: "bbox" type: "Convolution" bottom: "conv3" top: "bbox" convolution_param { num_output: 4 kernel_size: 1 } }\n')
    shapes = {"conv1": (10, 3, 3), "conv2": (16, 10, 3), "conv3": (32, 16, 3), "cls": (2, 32, 1), "bbox": (4, 32, 1)}
    blobs = {}
    for i, (n, (co, ci, k)) in enumerate(shapes.items()):
        blobs[n] = [rand(co, ci, k, k, seed=i) * np.sqrt(2 / (ci * k * k)), rand(co, seed=20 + i) * 0.1]
        if n.startswith("conv"):
            blobs[n + "_prelu"] = [np.abs(rand(co, seed=40 + i)) * 0.3]
    return make_net(tmp_path, body, {"data": [1, 3, 12, 12]}, blobs, name="pnet")


def rnet(tmp_path):
    body = (_conv("conv1", "data", 8, 3)
            + 'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }\n'
            + _conv("conv2", "pool1", 16, 3)
            + 'layer { name: "fc1" type: "InnerProduct" bottom: "conv2" top: "fc1" inner_product_param { num_output: 32 } }\n'
            + 'layer { name: "fc1_prelu" type: "PReLU" bottom: "fc1" top: "fc1" prelu_param { channel_shared: true } }\n'
            + 'layer { name: "drop" type: "Dropout" bottom: "fc1" top: "fc1" }\n'
            + 'layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2" inner_product_param { num_output: 2 } }\n'
            + 'layer { name: "prob" type: "Softmax" bottom: "fc2" top: "prob" }\n')
    blobs = {"conv1": [rand(8, 3, 3, 3, seed=1) * 0.4, rand(8, seed=2) * 0.1],
             "conv1_prelu": [np.abs(rand(8, seed=3)) * 0.3],
             "conv2": [rand(16, 8, 3, 3, seed=4) * 0.2, rand(16, seed=5) * 0.1],
             "conv2_prelu": [np.abs(rand(16, seed=6)) * 0.3],
             "fc1": [rand(32, 16 * 9 * 9, seed=7) * 0.03, rand(32, seed=8) * 0.1],
             "fc1_prelu": [np.array([0.2], np.float32)],
             "fc2": [rand(2, 32, seed=9) * 0.2, rand(2, seed=10) * 0.1]}
    return make_net(tmp_path, body, {"data": [1, 3, 24, 24]}, blobs, name="rnet")


def test_pnet_dynamic_batch_and_spatial(tmp_path):
    proto, model = pnet(tmp_path)
    x = rand(2, 3, 12, 12, seed=3)
    ours, path = export_and_run(proto, model, {"data": x})
    dims = [d.dim_param or d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, "H", "W"], dims
    sess = ort_session(path)
    for shape in [(2, 3, 12, 12), (3, 3, 37, 29), (1, 3, 64, 48)]:  # pyramid levels, odd sizes
        x = rand(*shape, seed=sum(shape))
        got = dict(zip(["prob", "bbox"], sess.run(["prob", "bbox"], {"data": x})))
        ref = run_cv(proto, model, {"data": x}, ["prob", "bbox"])  # OpenCV reshapes to the input
        for k in ("prob", "bbox"):
            assert got[k].shape == ref[k].shape and rel_err(got[k], ref[k]) <= 1e-4, (shape, k)


def test_rnet_fixed_spatial_dynamic_batch(tmp_path):
    proto, model = rnet(tmp_path)
    x = rand(5, 3, 24, 24, seed=4)
    ours, path = export_and_run(proto, model, {"data": x})
    dims = [d.dim_param or d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, 24, 24], dims
    ref = run_cv(proto, model, {"data": x}, ["prob"])["prob"]
    assert ours["prob"].shape == (5, 2) and rel_err(ours["prob"], ref) <= 1e-4


def test_cascade_qdq_matches_fake_quant(tmp_path):
    """QDQ models of both nets (default: uint8 activations, integer form where needed) in ORT
    without graph optimizations: the fake-quant model's outputs up to float rounding, except
    behind a value on a rounding tie; the P-Net's QDQ model also runs at another size."""
    for build, shape in ((pnet, (3, 3, 20, 26)), (rnet, (4, 3, 24, 24))):
        proto, model = build(tmp_path)
        gm = fuse_bn(load_caffe(proto, model)).graph
        calib = rand(*shape, seed=11)
        recs = minmax_records(gm, torch.from_numpy(calib))
        _, qp = export_onnx(gm, recs, str(tmp_path / proto.split("/")[-1][:-9]))
        x = rand(*shape, seed=12)
        with torch.no_grad():
            want = fake_quant_graph(gm, recs)(torch.from_numpy(x))["prob"].numpy()
        got = ort_run(qp, x, "DISABLE_ALL", outputs=["prob"])["prob"]
        off = np.abs(got - want) > 1e-4
        assert got.shape == want.shape and off.mean() <= 0.002, (proto, off.mean())
