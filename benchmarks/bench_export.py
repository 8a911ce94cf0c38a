"""Export benchmark (JSON lines): ONNX Runtime CPU latency on nsfw at batch 1 and 8 of our
int8 QDQ model (int8 and uint8 activations) vs the float model and vs ORT's own
``quantize_static`` QDQ output (per channel, the same calibration crops, S8S8 and U8S8);
and the time of ``convert_model`` on nsfw.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_export.py
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import natural_images_bgr, nsfw_dir  # noqa: E402

from amct_torch.algorithms.arq import arq_quantize  # noqa: E402
from amct_torch.caffe.graph import layer_modules, load_caffe  # noqa: E402
from amct_torch.caffe.layers import is_quantizable  # noqa: E402
from amct_torch.export import convert_model, export_onnx  # noqa: E402
from amct_torch.fusion import fuse_bn  # noqa: E402
from amct_torch.record import LayerRecord, write_record  # noqa: E402


def minmax_records(gm, x):
    """Activation factors from plain min/max over the calibration crops; weights with ARQ."""
    seen, hooks, mods = {}, [], layer_modules(gm)
    for n, m in mods.items():
        if is_quantizable(m):
            hooks.append(m.register_forward_pre_hook(
                lambda mod, inp, n=n: seen.__setitem__(n, (float(inp[0].min()), float(inp[0].max())))))
    with torch.no_grad():
        gm(x)
    for h in hooks:
        h.remove()
    recs = {}
    for n, (lo, hi) in seen.items():
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        s = (hi - lo) / 255
        r = LayerRecord(s, int(-round(lo / s) - 128), channels=1, height=1, width=1)
        m = mods[n]
        if m.caffe_type != "Pooling":
            a = arq_quantize(m.weight, m.caffe_type, m.caffe_type != "InnerProduct")
            r.scale_w, r.offset_w = a.scale_w.tolist(), [0] * a.scale_w.numel()
        recs[n] = r
    return recs


def latency(path, x, runs=20):
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    for _ in range(3):
        s.run(None, {name: x})
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        s.run(None, {name: x})
        t.append(time.perf_counter() - t0)
    return float(np.median(t))


def ort_static(float_path, out_path, calib, act_type):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"data": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.items, None)

    quantize_static(float_path, out_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=act_type, weight_type=QuantType.QInt8)


def main():
    d = nsfw_dir()
    proto, weights = os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
    calib = natural_images_bgr(count=8, seed=1)
    gm = fuse_bn(load_caffe(proto, weights)).graph
    recs = minmax_records(gm, torch.from_numpy(calib))
    from onnxruntime.quantization import QuantType
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for act in ("int8", "uint8"):
            f, q = export_onnx(gm, recs, os.path.join(tmp, f"ours_{act}"), activations=act)
            models["float"], models[f"ours_{act}"] = f, q
        for tag, qt in (("ort_s8s8", QuantType.QInt8), ("ort_u8s8", QuantType.QUInt8)):
            models[tag] = os.path.join(tmp, f"{tag}.onnx")
            ort_static(models["float"], models[tag], calib, qt)
        for batch in (1, 8):
            x = natural_images_bgr(count=batch, seed=2)
            lat = {k: latency(p, x) for k, p in models.items()}
            best_ort = min(lat["ort_s8s8"], lat["ort_u8s8"])
            for k, v in lat.items():
                print(json.dumps({"bench": "onnxruntime_cpu_nsfw", "batch": batch, "model": k,
                                  "latency_ms": round(v * 1e3, 2),
                                  "speed_vs_float": round(lat["float"] / v, 3),
                                  "speed_vs_best_ort_quant": round(best_ort / v, 3)}), flush=True)
        rec_path = os.path.join(tmp, "record.txt")
        write_record(rec_path, recs)
        t0 = time.perf_counter()
        convert_model(proto, weights, rec_path, os.path.join(tmp, "nsfw"))
        print(json.dumps({"bench": "convert_model_nsfw", "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
