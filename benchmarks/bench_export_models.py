"""The output models' figures, one JSON line per test model (nsfw, the code-built ResNet-style SSD net,
the PReLU cascade's P-Net and R-Net):

- ``float_onnx_vs_opencv``: max |ORT − OpenCV| / max(1, max|OpenCV|) of the float ONNX model
  on every output (SSD: detections as sets, see tests/helpers/onnx_layers.py);
- ``qdq_vs_fake_quant``: share of output elements of the default QDQ model in ORT within
  1e-4·max|out| of the torch fake-quant model, graph optimizations off and on, and the SQNR
  between them (ORT's int8 kernels requantize their own way);
- ``int8_kernels``: convolutions / inner products ORT's optimized graph runs as int8 kernels
  (QLinearConv, ConvInteger / QGemm, MatMulInteger) and how many layers are quantized;
- ``latency_ms``: ORT median latency (min) of the float and the int8 model at batch 1 and 8;
- ``deploy_vs_fake_quant``: share of output elements of the deploy model run by ``load_caffe``
  (integer semantics) within one quantization step (scale_d) of the last quantized layer of the
  fake-quant model, and the SQNR between them.

Activation factors: asymmetric min/max on 4 natural images (tests/helpers/exports.py), weights
ARQ; evaluation on other images. Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_export_models.py
[--threads 2] [--rounds 10]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from test_export_onnx_cascade import pnet, rnet  # noqa: E402

from amct_torch.caffe.graph import layer_modules, load_caffe  # noqa: E402
from amct_torch.export import export_onnx, fake_quant_graph, save_quant_models  # noqa: E402
from amct_torch.fusion import fuse_bn  # noqa: E402
from conftest import natural_images_bgr, nsfw_dir  # noqa: E402
from helpers.caffe_nets import run_cv  # noqa: E402
from helpers.exports import minmax_records  # noqa: E402
from helpers.onnx_layers import detection_sets_match  # noqa: E402
from helpers.ssd import ssd_net  # noqa: E402

INT8_CONV = ("QLinearConv", "ConvInteger")
INT8_FC = ("QGemm", "MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul")


def _session(path, threads, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, opt=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if opt:
        so.optimized_model_filepath = opt
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _sqnr(ref, out):
    err = float(((out.astype(np.float64) - ref) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / err)


def _latency(paths, x_by_batch, threads, rounds):
    """Median/min ms per (model, batch); the models are run in turn each round."""
    sess = {k: _session(p, threads) for k, p in paths.items()}
    times = collections.defaultdict(list)
    for bs, x in x_by_batch.items():
        for s in sess.values():
            for _ in range(3):
                s.run(None, {"data": x})
        for _ in range(rounds):
            for k, s in sess.items():
                t = time.perf_counter()
                s.run(None, {"data": x})
                times[(k, bs)].append((time.perf_counter() - t) * 1000)
    return {f"{k}_b{bs}": [round(statistics.median(v), 2), round(min(v), 2)] for (k, bs), v in times.items()}


def bench(name, proto, model, calib, evalx, outputs, detection, threads, rounds, tmp):
    gm = fuse_bn(load_caffe(proto, model)).graph
    recs = minmax_records(gm, torch.from_numpy(calib))
    mods = layer_modules(gm)
    fp, qp = export_onnx(gm, recs, os.path.join(tmp, name))
    row = {"model": name}
    # float ONNX vs OpenCV
    got = dict(zip(outputs, _session(fp, threads).run(outputs, {"data": evalx})))
    cv = run_cv(proto, model, {"data": evalx}, outputs)
    parity = {}
    for k in outputs:
        if detection and k == "detection_out":
            try:
                detection_sets_match(got[k], cv[k])
                parity[k] = "sets equal (1e-4)"
            except AssertionError as err:
                parity[k] = f"differs: {str(err)[:60]}"
        else:
            ref = cv[k].reshape(got[k].shape)
            parity[k] = float(np.abs(got[k] - ref).max() / max(1.0, float(np.abs(ref).max())))
    row["float_onnx_vs_opencv"] = parity
    # QDQ vs torch fake-quant, on the non-detection outputs (or the heads before DetectionOutput)
    fq = fake_quant_graph(gm, recs)
    cmp_outs = [o for o in outputs if o != "detection_out"] or []
    if detection:
        cmp_outs = ["mbox_loc", "mbox_conf_flatten"]
        _, qp_cut = export_onnx(gm, recs, os.path.join(tmp, name + "_cut"), outputs=cmp_outs)
    else:
        qp_cut = qp
    want, hooks, fm = {}, [], layer_modules(fq)
    for k in cmp_outs:
        hooks.append(fm[k].register_forward_hook(lambda m, i, o, k=k: want.__setitem__(k, o.detach().numpy().copy())))
    with torch.no_grad():
        fq(torch.from_numpy(evalx))
    for h in hooks:
        h.remove()
    agree = {}
    for tag, level in (("opt_off", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                       ("opt_all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        res = dict(zip(cmp_outs, _session(qp_cut, threads, level).run(cmp_outs, {"data": evalx})))
        agree[tag] = {k: {"within_1e-4": round(float((np.abs(res[k] - want[k]) <= 1e-4 * np.abs(want[k]).max()).mean()), 5),
                          "sqnr_db": round(_sqnr(want[k], res[k]), 1)} for k in cmp_outs}
    row["qdq_vs_fake_quant"] = agree
    # int8 kernels in ORT's optimized graph
    _session(qp, threads, opt=os.path.join(tmp, name + "_opt.onnx"))
    ops = collections.Counter(n.op_type for n in onnx.load(os.path.join(tmp, name + "_opt.onnx")).graph.node)
    n_conv = sum(mods[n].caffe_type in ("Convolution", "Deconvolution") for n in recs)
    n_fc = sum(mods[n].caffe_type == "InnerProduct" for n in recs)
    row["int8_kernels"] = {"conv": f"{sum(ops[k] for k in INT8_CONV)}/{n_conv}",
                           "fc": f"{sum(ops[k] for k in INT8_FC)}/{n_fc}",
                           "float_conv_left": ops["Conv"] + ops["FusedConv"],
                           "ops": {k: ops[k] for k in INT8_CONV + INT8_FC + ("QLinearAdd",) if ops[k]}}
    # latency
    c, h, w = evalx.shape[1:]
    xb = {1: evalx[:1], 8: np.concatenate([evalx] * (8 // len(evalx) + 1))[:8]}
    row["latency_ms"] = _latency({"float": fp, "int8": qp}, xb, threads, rounds)
    # deploy (integer semantics) vs fake-quant model, both from the written files
    prefix = os.path.join(tmp, name + "_q")
    save_quant_models(gm, recs, save_path=prefix)
    res = {}
    for kind in ("fake_quant", "deploy"):
        g = load_caffe(f"{prefix}_{kind}_model.prototxt", f"{prefix}_{kind}_weights.caffemodel")
        o, gm_mods = {}, layer_modules(g)
        hs = [gm_mods[k].register_forward_hook(lambda m, i, y, k=k, o=o: o.__setitem__(k, y.detach().double().numpy().copy()))
              for k in cmp_outs if k in gm_mods]
        with torch.no_grad():
            o.update({k: v.double().numpy() for k, v in g(torch.from_numpy(evalx)).items()})
        for hh in hs:
            hh.remove()
        res[kind] = o
    last = {"nsfw": ["fc_nsfw"], "ssd": ["h1_loc", "h2_loc", "h1_conf", "h2_conf"],
            "pnet": ["cls", "bbox"], "rnet": ["fc2"]}[name]
    step = min(recs[n].scale_d for n in last)
    row["deploy_vs_fake_quant"] = {
        k: {"within_one_step": round(float((np.abs(res["deploy"][k] - res["fake_quant"][k]) <= step).mean()), 5),
            "sqnr_db": round(_sqnr(res["fake_quant"][k], res["deploy"][k]), 1)}
        for k in cmp_outs if k in res["deploy"]}
    print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        d = nsfw_dir()
        cases = [
            ("nsfw", lambda: (os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")),
             natural_images_bgr(count=4, seed=1), natural_images_bgr(count=4, seed=3), ["prob"], False),
            ("ssd", lambda: ssd_net(tmp, size=300), natural_images_bgr(size=300, count=4, seed=1) / 64.0,
             natural_images_bgr(size=300, count=4, seed=3) / 64.0, ["detection_out"], True),
            ("pnet", lambda: pnet(tmp), natural_images_bgr(size=48, count=4, seed=1) / 128.0,
             natural_images_bgr(size=48, count=4, seed=3) / 128.0, ["prob", "bbox"], False),
            ("rnet", lambda: rnet(tmp), natural_images_bgr(size=24, count=4, seed=1) / 128.0,
             natural_images_bgr(size=24, count=4, seed=3) / 128.0, ["prob"], False),
        ]
        for name, files, calib, evalx, outs, det in cases:
            if only and name not in only:
                continue
            proto, model = files()
            bench(name, proto, model, calib.astype(np.float32), evalx.astype(np.float32), outs, det,
                  a.threads, a.rounds, tmp)


if __name__ == "__main__":
    main()
