"""ONNX export of the segmentation / detection forks' layers (Interp, MVN, Reorg, ROIPooling,
PSROIPooling, Proposal, py-faster-rcnn's Python proposal): the float model in ONNX Runtime
against the torch modules (themselves checked against OpenCV in
tests/caffe/test_caffe_layers_forks_detection.py) and against OpenCV directly where it runs
the layer; the QDQ model loads and runs in ONNX Runtime; end to end through
``amct_torch.quantize(..., onnx=True)`` on a Faster R-CNN / R-FCN-like net (inputs data +
im_info) and a PSPNet-like net, with the fake-quant and deploy Caffe models keeping the
layers as the user wrote them."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
from google.protobuf import text_format

import amct_torch
from amct_torch.caffe.graph import load_caffe
from amct_torch.export.onnx.qdq import export_onnx
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_nets import make_net, rand, run_cv, run_ours
from helpers.data import natural_images_bgr
from helpers.exports import minmax_records
from helpers.onnx_layers import export_and_run, rel_err
from helpers.runtimes import ORT_INT8_CONV, ORT_INT8_FC, ort_optimized_ops, ort_run

# -- one layer at a time: float ONNX vs torch (and OpenCV), batch 1 and 2 ---------------------
SEG_CASES = [
    ("interp_zoom", 'interp_param { zoom_factor: 2 }', "Interp", (1, 3, 5, 7)),
    ("interp_shrink", 'interp_param { shrink_factor: 2 }', "Interp", (1, 3, 9, 8)),
    ("interp_size", 'interp_param { height: 13 width: 6 }', "Interp", (1, 3, 5, 7)),
    ("interp_size1", 'interp_param { height: 1 width: 1 }', "Interp", (1, 2, 5, 7)),
    ("interp_pads", 'interp_param { zoom_factor: 2 pad_beg: -1 pad_end: -1 }', "Interp", (1, 3, 9, 7)),
    ("interp_pad_end", 'interp_param { zoom_factor: 3 pad_end: -2 }', "Interp", (1, 2, 9, 7)),
    ("interp_both", 'interp_param { shrink_factor: 2 zoom_factor: 3 }', "Interp", (1, 3, 9, 7)),
    ("mvn", '', "MVN", (1, 3, 5, 7)),
    ("mvn_across", 'mvn_param { across_channels: true eps: 0.01 }', "MVN", (1, 3, 5, 7)),
    ("mvn_mean_only", 'mvn_param { normalize_variance: false }', "MVN", (1, 3, 5, 7)),
    ("reorg2", 'reorg_param { stride: 2 }', "Reorg", (1, 8, 6, 10)),
    ("reorg3", 'reorg_param { stride: 3 }', "Reorg", (1, 18, 6, 9)),
]


@pytest.mark.parametrize("case,param,typ,shape", SEG_CASES, ids=[c[0] for c in SEG_CASES])
def test_segmentation_layers_float_onnx(tmp_path, case, param, typ, shape):
    body = f'layer {{ name: "y" type: "{typ}" bottom: "data" top: "y" {param} }}'
    p, m = make_net(tmp_path, body, {"data": shape})
    for n, seed in ((1, 3), (2, 4)):
        x = rand(n, *shape[1:], seed=seed)
        ours = run_ours(p, m, x)["y"]
        onx, _ = export_and_run(p, m, {"data": x})
        assert onx["y"].shape == ours.shape
        assert rel_err(onx["y"], ours) <= 1e-5, case


def _rois(n_rois, h, w, stride, n=1, seed=0):
    rng = np.random.default_rng(seed)
    x1, y1 = rng.uniform(-10, w * stride, n_rois), rng.uniform(-10, h * stride, n_rois)
    return np.stack([rng.integers(0, n, n_rois), x1, y1, x1 + rng.uniform(0, w * stride / 2, n_rois),
                     y1 + rng.uniform(0, h * stride / 2, n_rois)], 1).astype(np.float32)


ROI_CASES = [
    ("roi7", 'type: "ROIPooling" roi_pooling_param { pooled_h: 7 pooled_w: 7 spatial_scale: 0.0625 }', (1, 5, 13, 17), 16),
    ("roi35", 'type: "ROIPooling" roi_pooling_param { pooled_h: 3 pooled_w: 5 spatial_scale: 0.125 }', (2, 4, 11, 9), 8),
    ("psroi3", 'type: "PSROIPooling" psroi_pooling_param { spatial_scale: 0.0625 output_dim: 3 group_size: 3 }',
     (1, 27, 13, 17), 16),
    ("psroi2_b2", 'type: "PSROIPooling" psroi_pooling_param { spatial_scale: 0.125 output_dim: 2 group_size: 2 }',
     (2, 8, 11, 9), 8),
]


@pytest.mark.parametrize("case,param,shape,stride", ROI_CASES, ids=[c[0] for c in ROI_CASES])
def test_roi_layers_float_onnx(tmp_path, case, param, shape, stride):
    rois = _rois(15, shape[2], shape[3], stride, n=shape[0])
    rois[0, 1:] = [8.5, 7.5, 40.5, 33.5]
    p, m = make_net(tmp_path, f'layer {{ name: "y" {param} bottom: "data" bottom: "rois" top: "y" }}',
                    {"data": shape, "rois": rois.shape})
    x = rand(*shape, seed=5)
    ours = run_ours(p, m, x, rois)["y"]
    onx, _ = export_and_run(p, m, {"data": x, "rois": rois})
    assert rel_err(onx["y"], ours) <= 1e-5
    if shape[0] == 1:
        assert rel_err(onx["y"], run_cv(p, m, {"data": x, "rois": rois}, ["y"])["y"]) <= 1e-4


STD = "ratio: 0.5 ratio: 1 ratio: 2 scale: 8 scale: 16 scale: 32"
PROPOSAL_CASES = [
    ("p9", f'type: "Proposal" proposal_param {{ feat_stride: 16 {STD} pre_nms_topn: 100 post_nms_topn: 30 }}',
     9, 5, 7, (100.7, 130.2, 1.6)),
    ("p2", 'type: "Proposal" proposal_param { feat_stride: 8 base_size: 8 ratio: 1 scale: 2 scale: 4 '
     'pre_nms_topn: 40 post_nms_topn: 50 nms_thresh: 0.5 }', 2, 9, 11, (70, 90, 1)),
    ("python", 'type: "Python" python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
     'param_str: "\'feat_stride\': 16" }', 9, 6, 8, (95, 127, 1)),
]


@pytest.mark.parametrize("case,param,a,h,w,im", PROPOSAL_CASES, ids=[c[0] for c in PROPOSAL_CASES])
def test_proposal_float_onnx(tmp_path, case, param, a, h, w, im):
    """Rows equal to torch's (hence OpenCV's) with distinct random scores; two top forms."""
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1, (1, 2 * a, h, w)).astype(np.float32)
    d = (rng.standard_normal((1, 4 * a, h, w)) * 0.3).astype(np.float32)
    info = np.array([im], np.float32)
    tops = 'top: "y"' if case != "p2" else 'top: "y" top: "sc"'
    p, m = make_net(tmp_path, f'layer {{ name: "prop" {param} bottom: "s" bottom: "d" bottom: "im_info" {tops} }}',
                    {"s": s.shape, "d": d.shape, "im_info": info.shape})
    ours = run_ours(p, m, s, d, info)
    onx, _ = export_and_run(p, m, {"s": s, "d": d, "im_info": info})
    for k, v in ours.items():
        assert onx[k].shape == v.shape and rel_err(onx[k], v) <= 1e-5, k


def test_proposal_onnx_near_touching_boxes_differ_as_documented(tmp_path):
    """Two boxes 0.5 px apart: Caffe/OpenCV count no overlap, ONNX's NMS on (x2 + 1, y2 + 1) an
    overlap of 0.5 px: with a threshold of 0.001 the second box is dropped in ONNX only."""
    s = np.zeros((1, 2, 1, 2), np.float32)
    s[0, 1] = [[0.9, 0.8]]
    d = np.zeros((1, 4, 1, 2), np.float32)
    d[0, 0, 0, 1] = (16.5 - 16) / 16  # shift the second anchor right by 0.5 px: gap of 0.5 px
    p, m = make_net(tmp_path, 'layer { name: "prop" type: "Proposal" bottom: "s" bottom: "d" bottom: "im_info" '
                    'top: "y" proposal_param { feat_stride: 16 ratio: 1 scale: 1 nms_thresh: 0.001 } }',
                    {"s": s.shape, "d": d.shape, "im_info": (1, 3)})
    info = np.array([[64, 64, 1]], np.float32)
    ours = run_ours(p, m, s, d, info)["y"]
    ref = run_cv(p, m, {"s": s, "d": d, "im_info": info}, ["prop"])["prop"]
    onx, _ = export_and_run(p, m, {"s": s, "d": d, "im_info": info})
    assert ours.shape[0] == 2 and np.allclose(ref[:2], ours)
    assert onx["y"].shape[0] == 1 and np.allclose(onx["y"], ours[:1])


# -- end to end ---------------------------------------------------------------------------------
FRCNN = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "rpn_conv" type: "Convolution" bottom: "conv2" top: "rpn" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "rpn_relu" type: "ReLU" bottom: "rpn" top: "rpn" }
layer { name: "rpn_cls_score" type: "Convolution" bottom: "rpn" top: "rpn_cls_score" convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "rpn" top: "rpn_bbox_pred" convolution_param { num_output: 12 kernel_size: 1 } }
layer { name: "rpn_cls_score_reshape" type: "Reshape" bottom: "rpn_cls_score" top: "rpn_cls_score_reshape" reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }
layer { name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape" top: "rpn_cls_prob" }
layer { name: "rpn_cls_prob_reshape" type: "Reshape" bottom: "rpn_cls_prob" top: "rpn_cls_prob_reshape" reshape_param { shape { dim: 0 dim: 6 dim: -1 dim: 0 } } }
layer { name: "proposal" type: "Python" bottom: "rpn_cls_prob_reshape" bottom: "rpn_bbox_pred" bottom: "im_info" top: "rois"
  python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" param_str: "'feat_stride': 4, 'scales': (2, 4, 8), 'ratios': (1,)" } }
layer { name: "roi_pool" type: "ROIPooling" bottom: "conv2" bottom: "rois" top: "roi_pool" roi_pooling_param { pooled_w: 3 pooled_h: 3 spatial_scale: 0.25 } }
layer { name: "fc6" type: "InnerProduct" bottom: "roi_pool" top: "fc6" inner_product_param { num_output: 16 } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "cls_score" type: "InnerProduct" bottom: "fc6" top: "cls_score" inner_product_param { num_output: 3 } }
layer { name: "cls_prob" type: "Softmax" bottom: "cls_score" top: "cls_prob" }
layer { name: "rfcn_cls" type: "Convolution" bottom: "conv2" top: "rfcn_cls" convolution_param { num_output: 18 kernel_size: 1 } }
layer { name: "psroi" type: "PSROIPooling" bottom: "rfcn_cls" bottom: "rois" top: "psroi" psroi_pooling_param { spatial_scale: 0.25 output_dim: 2 group_size: 3 } }
layer { name: "ave_cls" type: "Pooling" bottom: "psroi" top: "ave_cls" pooling_param { pool: AVE global_pooling: true } }
'''
MY_TYPES = ("Python", "ROIPooling", "PSROIPooling", "Interp", "MVN", "Reorg")


def frcnn_net(tmp_path):
    rng = np.random.default_rng(0)
    f = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    blobs = {"conv1": [f(8, 3, 3, 3), f(8)], "conv2": [f(8, 8, 3, 3), f(8)], "rpn_conv": [f(8, 8, 3, 3), f(8)],
             "rpn_cls_score": [f(6, 8, 1, 1), f(6)], "rpn_bbox_pred": [f(12, 8, 1, 1) * 0.3, f(12) * 0.1],
             "fc6": [f(16, 72), f(16)], "cls_score": [f(3, 16), f(3)], "rfcn_cls": [f(18, 8, 1, 1), f(18)]}
    return make_net(tmp_path, FRCNN, {"data": (1, 3, 40, 48), "im_info": (1, 3)}, blobs, name="frcnn")


def _layer_blocks(prototxt: str) -> dict[str, pb.LayerParameter]:
    """Each ``layer { ... }`` block of a written prototxt parsed alone (the AMCT Quant layers'
    integer offsets are not schema text, so the whole file is not parsed here)."""
    text = open(prototxt).read()
    out = {}
    for mt in re.finditer(r"(?m)^layer \{", text):
        depth, i = 0, mt.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        block = text[mt.end():i - 1]
        if "quant_param" in block:
            continue
        lp = text_format.Parse(block, pb.LayerParameter())
        out[lp.name] = lp
    return out


def _assert_written_back(src: str, written: str) -> None:
    before = {l.name: l for l in text_format.Parse(open(src).read(), pb.NetParameter()).layer}
    after = _layer_blocks(written)
    for name, lp in before.items():
        if lp.type in MY_TYPES:
            got = after[name]
            assert got.type == lp.type
            for field in ("interp_param", "mvn_param", "reorg_param", "roi_pooling_param", "psroi_pooling_param",
                          "proposal_param", "python_param"):
                assert getattr(got, field) == getattr(lp, field), (name, field)


def test_faster_rcnn_like_net_end_to_end(tmp_path):
    p, m = frcnn_net(tmp_path)
    imgs = natural_images_bgr(size=48, count=6, seed=2)[:, :, :40, :48] / 64.0
    info = np.array([[40, 48, 1]], np.float32)
    data = [(imgs[i:i + 1].astype(np.float32), info) for i in range(4)]
    out = str(tmp_path / "out" / "frcnn")
    res = amct_torch.quantize(p, m, data, output=out, onnx=True, batch_num=2, quiet=True)
    quantized = {"conv1", "conv2", "rpn_conv", "rpn_cls_score", "rpn_bbox_pred", "fc6", "cls_score", "rfcn_cls"}
    assert set(res.records) == quantized           # the ROI layers themselves are not quantized
    for kind in ("fake_quant", "deploy"):
        _assert_written_back(p, f"{out}_{kind}_model.prototxt")
    x = imgs[4:5].astype(np.float32)
    ref = run_ours(p, m, x, info)
    flt = ort_run(out + "_float.onnx", {"data": x, "im_info": info})
    assert ref["cls_prob"].shape[0] > 3
    for k in ("cls_prob", "ave_cls"):
        assert flt[k].shape == ref[k].shape and rel_err(flt[k], ref[k]) <= 1e-4, k
    q = ort_run(out + "_quant.onnx", {"data": x, "im_info": info})
    assert q["cls_prob"].shape[1] == 3 and np.isfinite(q["cls_prob"]).all()
    # two images with their own sizes: one NMS per image in ONNX, image after image in torch
    x2, info2 = imgs[4:6].astype(np.float32), np.array([[40, 48, 1], [30, 41, 1]], np.float32)
    ref2, flt2 = run_ours(p, m, x2, info2), ort_run(out + "_float.onnx", {"data": x2, "im_info": info2})
    for k in ("cls_prob", "ave_cls"):
        assert flt2[k].shape == ref2[k].shape and rel_err(flt2[k], ref2[k]) <= 1e-4, k
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert sum(ops[k] for k in ORT_INT8_CONV) == 6 and ops["Conv"] + ops["FusedConv"] == 0, ops
    # cls_score (nothing requantizes it) is MatMulInteger; fc6, requantized by cls_score, is left
    # by ORT as DequantizeLinear -> float Gemm (the exporter's float-bias form, as for any FC)
    assert sum(ops[k] for k in ORT_INT8_FC) >= 1, ops
    assert ops["MaxRoiPool"] == 1 and ops["NonMaxSuppression"] == 1


PSP = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool_a" type: "Pooling" bottom: "conv1" top: "pool_a" pooling_param { pool: AVE kernel_size: 11 stride: 11 } }
layer { name: "conv_a" type: "Convolution" bottom: "pool_a" top: "conv_a" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "interp_a" type: "Interp" bottom: "conv_a" top: "interp_a" interp_param { height: 33 width: 33 } }
layer { name: "pool_b" type: "Pooling" bottom: "conv1" top: "pool_b" pooling_param { pool: AVE kernel_size: 3 stride: 3 } }
layer { name: "conv_b" type: "Convolution" bottom: "pool_b" top: "conv_b" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "interp_b" type: "Interp" bottom: "conv_b" top: "interp_b" interp_param { height: 33 width: 33 } }
layer { name: "cat" type: "Concat" bottom: "conv1" bottom: "interp_a" bottom: "interp_b" top: "cat" }
layer { name: "mvn" type: "MVN" bottom: "cat" top: "mvn" }
layer { name: "conv_cls" type: "Convolution" bottom: "mvn" top: "conv_cls" convolution_param { num_output: 5 kernel_size: 3 pad: 1 } }
layer { name: "interp" type: "Interp" bottom: "conv_cls" top: "interp" interp_param { zoom_factor: 2 } }
'''


def test_pspnet_like_net_end_to_end(tmp_path):
    rng = np.random.default_rng(1)
    f = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    blobs = {"conv1": [f(8, 3, 3, 3), f(8)], "conv_a": [f(4, 8, 1, 1), f(4)], "conv_b": [f(4, 8, 1, 1), f(4)],
             "conv_cls": [f(5, 16, 3, 3), f(5)]}
    p, m = make_net(tmp_path, PSP, {"data": (1, 3, 65, 65)}, blobs, name="psp")
    imgs = (natural_images_bgr(size=65, count=6, seed=3) / 64.0).astype(np.float32)
    out = str(tmp_path / "out" / "psp")
    res = amct_torch.quantize(p, m, imgs[:4], output=out, onnx=True, batch_num=2, batch_size=2, quiet=True)
    assert {"conv1", "conv_a", "conv_b", "conv_cls"} <= set(res.records)
    for kind in ("fake_quant", "deploy"):
        _assert_written_back(p, f"{out}_{kind}_model.prototxt")
    x = imgs[4:6]
    ref = run_ours(p, m, x)["interp"]
    assert ref.shape == (2, 5, 65, 65)
    assert rel_err(ort_run(out + "_float.onnx", {"data": x})["interp"], ref) <= 1e-4
    # OpenCV runs this net (Interp with height/width and zoom_factor, MVN with the default eps)
    assert rel_err(ref[:1], run_cv(p, m, {"data": x[:1]}, ["interp"])["interp"]) <= 1e-4
    q = ort_run(out + "_quant.onnx", {"data": x})["interp"]
    assert q.shape == ref.shape and np.isfinite(q).all()
    cos = float((q * ref).sum() / np.sqrt((q * q).sum() * (ref * ref).sum()))
    assert cos > 0.99, cos
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert sum(ops[k] for k in ORT_INT8_CONV) == 4 and ops["Conv"] + ops["FusedConv"] == 0, ops


def test_qdq_export_of_each_layer_runs(tmp_path):
    """export_onnx's QDQ model of a quantized conv before each layer type loads and runs in ORT."""
    rng = np.random.default_rng(2)
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "reorg" type: "Reorg" bottom: "conv" top: "reorg" reorg_param { stride: 2 } }\n'
            'layer { name: "mvn" type: "MVN" bottom: "reorg" top: "mvn" }\n'
            'layer { name: "interp" type: "Interp" bottom: "mvn" top: "interp" interp_param { zoom_factor: 3 } }\n'
            'layer { name: "conv2" type: "Convolution" bottom: "interp" top: "conv2" convolution_param { num_output: 4 kernel_size: 1 } }')
    blobs = {"conv": [rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, np.zeros(8, np.float32)],
             "conv2": [rng.standard_normal((4, 32, 1, 1)).astype(np.float32) * 0.3, np.zeros(4, np.float32)]}
    p, m = make_net(tmp_path, body, {"data": (1, 3, 10, 14)}, blobs)
    gm = load_caffe(p, m)
    import torch
    x = torch.from_numpy(rand(2, 3, 10, 14, seed=6))
    recs = minmax_records(gm, x)
    fpath, qpath = export_onnx(gm, recs, str(tmp_path / "m"))
    ref = run_ours(p, m, x.numpy())["conv2"]
    assert rel_err(ort_run(fpath, {"data": x.numpy()})["conv2"], ref) <= 1e-5
    q = ort_run(qpath, {"data": x.numpy()})["conv2"]
    assert q.shape == ref.shape and np.abs(q - ref).max() < 0.1 * np.abs(ref).max()
    ops = ort_optimized_ops(qpath)
    assert sum(ops[k] for k in ORT_INT8_CONV) == 2 and ops["Conv"] + ops["FusedConv"] == 0, ops
    assert os.path.exists(fpath)


# -- py-faster-rcnn's ZF test net, scaled down (same layer kinds and parameters) -----------------
ZF = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 12 kernel_size: 7 pad: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 3 alpha: 0.00005 beta: 0.75 norm_region: WITHIN_CHANNEL engine: CAFFE } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1" pooling_param { kernel_size: 3 stride: 2 pad: 1 pool: MAX } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 16 kernel_size: 5 pad: 2 stride: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { kernel_size: 3 stride: 2 pad: 1 pool: MAX } }
layer { name: "conv5" type: "Convolution" bottom: "pool2" top: "conv5" convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "relu5" type: "ReLU" bottom: "conv5" top: "conv5" }
layer { name: "rpn_conv/3x3" type: "Convolution" bottom: "conv5" top: "rpn/output" convolution_param { num_output: 16 kernel_size: 3 pad: 1 stride: 1 } }
layer { name: "rpn_relu/3x3" type: "ReLU" bottom: "rpn/output" top: "rpn/output" }
layer { name: "rpn_cls_score" type: "Convolution" bottom: "rpn/output" top: "rpn_cls_score" convolution_param { num_output: 18 kernel_size: 1 } }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "rpn/output" top: "rpn_bbox_pred" convolution_param { num_output: 36 kernel_size: 1 } }
layer { bottom: "rpn_cls_score" top: "rpn_cls_score_reshape" name: "rpn_cls_score_reshape" type: "Reshape" reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }
layer { name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape" top: "rpn_cls_prob" }
layer { name: 'rpn_cls_prob_reshape' type: 'Reshape' bottom: 'rpn_cls_prob' top: 'rpn_cls_prob_reshape' reshape_param { shape { dim: 0 dim: 18 dim: -1 dim: 0 } } }
layer { name: 'proposal' type: 'Python' bottom: 'rpn_cls_prob_reshape' bottom: 'rpn_bbox_pred' bottom: 'im_info' top: 'rois'
  python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' param_str: "'feat_stride': 16" } }
layer { name: "roi_pool_conv5" type: "ROIPooling" bottom: "conv5" bottom: "rois" top: "roi_pool_conv5" roi_pooling_param { pooled_w: 6 pooled_h: 6 spatial_scale: 0.0625 } }
layer { name: "fc6" type: "InnerProduct" bottom: "roi_pool_conv5" top: "fc6" inner_product_param { num_output: 32 } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 scale_train: false } }
layer { name: "cls_score" type: "InnerProduct" bottom: "fc6" top: "cls_score" inner_product_param { num_output: 21 } }
layer { name: "bbox_pred" type: "InnerProduct" bottom: "fc6" top: "bbox_pred" inner_product_param { num_output: 84 } }
layer { name: "cls_prob" type: "Softmax" bottom: "cls_score" top: "cls_prob" loss_param { ignore_label: -1 normalize: true } }
'''


def _by_roi(rois: np.ndarray, *outs: np.ndarray) -> list[np.ndarray]:
    """Rows sorted by their ROI (rounded to 0.1 px): tied proposal scores may come in another
    order from OpenCV (the same boxes)."""
    key = np.round(rois[:, 1:], 1)
    order = np.lexsort(key.T[::-1])
    return [rois[order]] + [o[order] for o in outs]


@pytest.mark.parametrize("scale", [1 / 32, 1.0], ids=["distinct_scores", "tied_scores"])
def test_zf_faster_rcnn_like_net_matches_opencv(tmp_path, scale):
    """The whole detector (LRN, padded pooling, the RPN reshapes, the Python proposal, ROI
    pooling, caffe-fast-rcnn's scaled Dropout) against OpenCV, which runs the same net with the
    proposal as its Proposal type; then the float ONNX model against torch. With the raw input
    the RPN's softmax saturates and many scores tie: the same boxes, rows compared by ROI."""
    rng = np.random.default_rng(4)
    shapes = {"conv1": (12, 3, 7, 7), "conv2": (16, 12, 5, 5), "conv5": (16, 16, 3, 3), "rpn_conv/3x3": (16, 16, 3, 3),
              "rpn_cls_score": (18, 16, 1, 1), "rpn_bbox_pred": (36, 16, 1, 1), "fc6": (32, 576),
              "cls_score": (21, 32), "bbox_pred": (84, 32)}
    small = {"rpn_cls_score": 0.02, "rpn_bbox_pred": 0.02}
    blobs = {k: [(rng.standard_normal(s) * np.sqrt(2 / np.prod(s[1:])) * small.get(k, 1)).astype(np.float32),
                 (rng.standard_normal(s[0]) * 0.05).astype(np.float32)] for k, s in shapes.items()}
    inputs = {"data": (1, 3, 96, 128), "im_info": (1, 3)}
    body = ZF + 'layer { name: "rois_out" type: "Split" bottom: "rois" top: "rois_copy" }\n'
    p, m = make_net(tmp_path, body, inputs, blobs, name="zf")
    cv_body = body.replace("type: 'Python'", "type: 'Proposal'").replace(
        "python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' param_str: \"'feat_stride': 16\" }",
        "proposal_param { feat_stride: 16 ratio: 0.5 ratio: 1 ratio: 2 scale: 8 scale: 16 scale: 32 }")
    pc, mc = make_net(tmp_path, cv_body, inputs, blobs, name="zf_cv")
    x = ((natural_images_bgr(size=128, count=1, seed=5)[:, :, :96] - 110) * scale).astype(np.float32)
    info = np.array([[96, 128, 1]], np.float32)
    ours = run_ours(p, m, x, info)
    ref = run_cv(pc, mc, {"data": x, "im_info": info}, ["rois_out", "cls_prob", "bbox_pred"])
    n = ours["cls_prob"].shape[0]
    assert 10 < n < ref["cls_prob"].shape[0]   # OpenCV pads to post_nms_topn rows with zero ROIs
    a = _by_roi(ours["rois_copy"], ours["cls_prob"], ours["bbox_pred"])
    b = _by_roi(ref["rois_out"][:n], ref["cls_prob"][:n], ref["bbox_pred"][:n])
    assert np.abs(a[0] - b[0]).max() <= 0.01 * scale * 32
    for k, (u, v) in enumerate(zip(a[1:], b[1:])):
        assert rel_err(u, v) <= 1e-4, k
    onx, _ = export_and_run(p, m, {"data": x, "im_info": info})
    c = _by_roi(onx["rois_copy"], onx["cls_prob"], onx["bbox_pred"])
    for u, v in zip(a, c):
        assert u.shape == v.shape and rel_err(v, u) <= 1e-4


# -- YOLOv2: Reorg + Region ----------------------------------------------------------------------
ANCHORS = np.array([1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52], np.float32)
PERMUTE = 'permute_param { order: 0 order: 2 order: 3 order: 1 }'


@pytest.mark.parametrize("a,c,h,w,param,scale", [
    (5, 4, 13, 13, "anchors: 5 softmax: true", 2.0),
    (3, 2, 4, 5, "anchors: 3 softmax: true nms_threshold: 0 thresh: 0.1", 1.0),
    (2, 3, 5, 3, "num: 2 logistic: true nms_threshold: 0.3 thresh: 0.3", 1.0),
    (5, 20, 9, 11, "anchors: 5 softmax: true nms_threshold: 0.45 thresh: 0.05", 3.0),
])
def test_region_float_onnx(tmp_path, a, c, h, w, param, scale):
    body = (f'layer {{ name: "perm" type: "Permute" bottom: "data" top: "perm" {PERMUTE} }}\n'
            f'layer {{ name: "y" type: "Region" bottom: "perm" top: "y" region_param {{ classes: {c} {param} }} }}')
    p, m = make_net(tmp_path, body, {"data": (1, a * (5 + c), h, w)}, {"y": [ANCHORS[:2 * a].reshape(1, -1)]})
    for n, seed in ((1, 1), (2, 2)):
        x = rand(n, a * (5 + c), h, w, seed=seed) * scale
        ours = run_ours(p, m, x)["y"]
        onx, _ = export_and_run(p, m, {"data": x})
        assert onx["y"].shape == ours.shape and rel_err(onx["y"], ours) <= 1e-5
        assert np.array_equal(onx["y"][:, 5:] > 0, ours[:, 5:] > 0)


YOLO = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" convolution_param { num_output: 16 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" relu_param { negative_slope: 0.1 } }
layer { name: "reorg" type: "Reorg" bottom: "conv1" top: "reorg" reorg_param { stride: 2 } }
layer { name: "cat" type: "Concat" bottom: "reorg" bottom: "conv2" top: "cat" }
layer { name: "conv3" type: "Convolution" bottom: "cat" top: "conv3" convolution_param { num_output: 35 kernel_size: 1 } }
layer { name: "perm" type: "Permute" bottom: "conv3" top: "perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "region" type: "Region" bottom: "perm" top: "region" region_param { classes: 2 coords: 4 anchors: 5 softmax: true thresh: 0.05 } }
'''


def test_yolov2_like_net_end_to_end(tmp_path):
    rng = np.random.default_rng(5)
    f = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    blobs = {"conv1": [f(8, 3, 3, 3), f(8)], "conv2": [f(16, 8, 3, 3), f(16)], "conv3": [f(35, 48, 1, 1), f(35)],
             "region": [ANCHORS.reshape(1, -1)]}
    p, m = make_net(tmp_path, YOLO, {"data": (1, 3, 52, 52)}, blobs, name="yolo")
    imgs = (natural_images_bgr(size=52, count=6, seed=6) / 64.0).astype(np.float32)
    out = str(tmp_path / "out" / "yolo")
    res = amct_torch.quantize(p, m, imgs[:4], output=out, onnx=True, batch_num=2, batch_size=2, quiet=True)
    assert set(res.records) == {"conv1", "conv2", "conv3"}
    for kind in ("fake_quant", "deploy"):
        written = _layer_blocks(f"{out}_{kind}_model.prototxt")
        src = {lp.name: lp for lp in text_format.Parse(open(p).read(), pb.NetParameter()).layer}
        for name in ("reorg", "region"):
            assert written[name].type == src[name].type
            assert written[name].reorg_param == src[name].reorg_param
            assert written[name].region_param == src[name].region_param
    x = imgs[4:5]
    ref = run_ours(p, m, x)["region"]
    flt = ort_run(out + "_float.onnx", {"data": x})["region"]
    assert flt.shape == ref.shape == (13 * 13 * 5, 7) and rel_err(flt, ref) <= 1e-4
    q = ort_run(out + "_quant.onnx", {"data": x})["region"]
    assert q.shape == ref.shape
    assert np.abs(q[:, [0, 1, 4]] - ref[:, [0, 1, 4]]).max() < 0.05          # centres, objectness
    assert np.abs(np.log(q[:, 2:4] / ref[:, 2:4])).max() < 0.2               # sizes (exp of the logits)
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert sum(ops[k] for k in ORT_INT8_CONV) == 3 and ops["Conv"] + ops["FusedConv"] == 0, ops


def test_interp_and_mvn_keep_a_symbolic_spatial_size(tmp_path):
    """Interp computes its output size from the runtime shape: the model runs at other sizes."""
    from amct_torch.export.onnx.qdq import export_float_onnx
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "mvn" type: "MVN" bottom: "conv" top: "mvn" }\n'
            'layer { name: "shrink" type: "Interp" bottom: "mvn" top: "shrink" interp_param { shrink_factor: 2 pad_end: -1 } }\n'
            'layer { name: "y" type: "Interp" bottom: "shrink" top: "y" interp_param { zoom_factor: 3 } }')
    p, m = make_net(tmp_path, body, {"data": (1, 3, 16, 16)}, {"conv": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)]})
    path = export_float_onnx(load_caffe(p, m), str(tmp_path / "dyn.onnx"), dynamic_spatial=True)
    for h, w in ((16, 16), (37, 29), (9, 24)):
        x = rand(2, 3, h, w, seed=h)
        ours = run_ours(p, m, x)["y"]
        onx = ort_run(path, {"data": x})["y"]
        assert onx.shape == ours.shape and rel_err(onx, ours) <= 1e-5, (h, w)


def test_calibrate_command_takes_data_and_im_info_from_one_npz(tmp_path, capsys):
    """A two-input net from the command line: one .npz with an array per input, named after it."""
    from amct_torch.cli import main
    p, m = frcnn_net(tmp_path)
    imgs = (natural_images_bgr(size=48, count=4, seed=8)[:, :, :40, :48] / 64.0).astype(np.float32)
    info = np.tile(np.array([[40, 48, 1]], np.float32), (4, 1))
    np.savez(tmp_path / "calib.npz", data=imgs, im_info=info)
    out = str(tmp_path / "out" / "frcnn")
    assert main(["calibrate", "-q", p, m, str(tmp_path / "calib.npz"), "-o", out, "--onnx",
                 "--batch-size", "2", "--batch-num", "2"]) == 0
    assert os.path.exists(out + "_quant.onnx") and os.path.exists(out + "_record.txt")
    np.savez(tmp_path / "bad.npz", data=imgs)
    assert main(["calibrate", "-q", p, m, str(tmp_path / "bad.npz"), "-o", str(tmp_path / "o2" / "x")]) == 2
    assert "im_info" in capsys.readouterr().err
