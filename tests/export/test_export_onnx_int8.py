"""The default QDQ model runs every quantized convolution and inner product as an int8 kernel
in ONNX Runtime (counted in ORT's optimized graph: QLinearConv where a Q follows, the integer
form ConvInteger/MatMulInteger where nothing requantizes the output), with the fake-quant
model's numbers: on a ResNet-style SSD net, ORT's outputs equal the torch fake-quant model's
except where a value sits on a rounding tie; end to end through ``amct-torch calibrate --onnx``,
the int8 detections match the float ones (IoU ≥ 0.5) on natural images."""
from __future__ import annotations

import os

import numpy as np
import torch

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.cli import main
from amct_torch.export import export_onnx, fake_quant_graph
from amct_torch.fusion import fuse_bn
from helpers.data import natural_images_bgr, nsfw_dir
from helpers.exports import minmax_records, sqnr_db
from helpers.runtimes import ORT_FLOAT_CONV, ORT_FLOAT_FC, ORT_INT8_CONV, ORT_INT8_FC, ort_optimized_ops, ort_run
from helpers.ssd import ssd_net


def test_nsfw_every_quantized_layer_is_int8(tmp_path):
    d = nsfw_dir()
    gm = fuse_bn(load_caffe(os.path.join(d, "deploy.prototxt"),
                            os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"))).graph
    recs = minmax_records(gm, torch.from_numpy(natural_images_bgr(count=2, seed=1)))
    mods = layer_modules(gm)
    n_conv = sum(mods[n].caffe_type == "Convolution" for n in recs)
    n_fc = sum(mods[n].caffe_type == "InnerProduct" for n in recs)
    _, qp = export_onnx(gm, recs, str(tmp_path / "m"))
    ops = ort_optimized_ops(qp)
    assert sum(ops[k] for k in ORT_INT8_CONV) == n_conv == 53, ops
    assert sum(ops[k] for k in ORT_INT8_FC) == n_fc == 1, ops
    assert sum(ops[k] for k in ORT_FLOAT_CONV + ORT_FLOAT_FC) == 0, ops
    # the same model as the plain QDQ form: top-1 equal to the torch fake-quant model's
    x = natural_images_bgr(count=4, seed=3)
    with torch.no_grad():
        want = fake_quant_graph(gm, recs)(torch.from_numpy(x))["prob"].numpy()
    got = ort_run(qp, x)["prob"]
    assert np.array_equal(got.argmax(1), want.argmax(1))


def _ssd_quant(tmp_path):
    proto, model = ssd_net(tmp_path)
    gm = fuse_bn(load_caffe(proto, model)).graph
    x = natural_images_bgr(size=64, count=4, seed=1) / 64.0
    recs = minmax_records(gm, torch.from_numpy(x))
    return gm, recs


def test_ssd_int8_kernels_and_fake_quant_numbers(tmp_path):
    gm, recs = _ssd_quant(tmp_path)
    mods = layer_modules(gm)
    n_conv = sum(mods[n].caffe_type == "Convolution" for n in recs)
    heads = ["mbox_loc", "mbox_conf_flatten"]
    _, qp = export_onnx(gm, recs, str(tmp_path / "s"), outputs=heads)
    ops = ort_optimized_ops(qp)
    assert sum(ops[k] for k in ORT_INT8_CONV) == n_conv == 9, ops
    assert ops["Conv"] + ops["FusedConv"] == 0, ops
    x = natural_images_bgr(size=64, count=3, seed=7) / 64.0
    fq = fake_quant_graph(gm, recs)
    want, fq_mods = {}, layer_modules(fq)
    hooks = [fq_mods[k].register_forward_hook(lambda m, i, o, k=k: want.__setitem__(k, o.numpy().copy()))
             for k in heads]
    with torch.no_grad():
        fq(torch.from_numpy(x))
    for h in hooks:
        h.remove()
    for level in ("DISABLE_ALL", "ENABLE_ALL"):
        got = ort_run(qp, x, level)
        for k in heads:
            err = np.abs(got[k] - want[k])
            if level == "DISABLE_ALL":
                # equal up to float rounding except behind a value that sat on a rounding tie
                off = err > 1e-4 * np.abs(want[k]).max()
                assert off.mean() <= 0.001, (k, off.mean())
            else:
                # ORT's int8 kernels requantize the exact int32 sum with a float multiplier and
                # quantize the bias themselves: codes move by one step near ties, and that
                # travels through the 4-5 quantized layers in front of each head
                sqnr = sqnr_db(want[k], got[k])
                assert sqnr >= 30, (k, sqnr)


def _iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / ua if ua > 0 else 0.0


def test_ssd_calibrate_onnx_end_to_end(tmp_path, capsys):
    proto, model = ssd_net(tmp_path, conf_thr=0.5)
    data = tmp_path / "calib.npy"
    np.save(data, natural_images_bgr(size=64, count=8, seed=1) / 64.0)
    out = str(tmp_path / "out" / "ssd")
    assert main(["calibrate", "-q", proto, model, str(data), "-o", out, "--onnx",
                 "--report-batches", "0"]) == 0
    capsys.readouterr()
    ops = ort_optimized_ops(out + "_quant.onnx")
    assert sum(ops[k] for k in ORT_INT8_CONV) == 9 and ops["Conv"] + ops["FusedConv"] == 0, ops
    x = natural_images_bgr(size=64, count=4, seed=9) / 64.0
    flt = ort_run(out + "_float.onnx", x)["detection_out"].reshape(-1, 7)
    q = ort_run(out + "_quant.onnx", x)["detection_out"].reshape(-1, 7)
    flt = flt[flt[:, 1] >= 0]
    assert len(flt) >= 4
    matched = sum(any(r[0] == s[0] and r[1] == s[1] and _iou(r[3:], s[3:]) >= 0.5 for s in q) for r in flt)
    assert matched >= 0.9 * len(flt), (matched, len(flt))
