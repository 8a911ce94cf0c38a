"""Loader benchmark: nsfw (ResNet-50-1by2) load time and CPU forward time of our graph vs
OpenCV's Caffe importer (``cv2.dnn``, its own CPU backend), batch 1 and 32; prints JSON lines.

Four builds of our graph are timed against OpenCV:
  plain        ``load_caffe`` as loaded: NCHW, BatchNorm and Scale run as their own layers;
  plain_cl     the same graph with weights and input in channels-last memory format;
  folded       ``fold_for_inference`` (BN+Scale folded into the convolutions, which is what
               OpenCV does too; legitimate wherever only the float model is run);
  folded_cl    folded and channels-last — the fast path for float-only inference.
Both runtimes use the same thread count (``--threads``, default torch's). The machine may be
shared, so every repetition runs all five in turn (rotating the order) after a warm-up, and
the figures are medians (minimums given too); the load average is printed with them.

Run: PYTHONPATH=. python benchmarks/bench_loader.py [--repeats N] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

import numpy as np
import torch

from nsfw_data import nsfw_files  # benchmarks/, run as scripts


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function: one warm-up each, then ``repeats`` rounds in which
    every function runs once, the order rotating so none always follows the same neighbour."""
    names = list(fns)
    for n in names:
        fns[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds at batch 1 (batch 32: half, >= 3)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    import cv2

    from amct_torch import load_caffe
    from amct_torch.caffe.graph import layer_modules
    from amct_torch.fusion import fold_for_inference

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    proto, weights = nsfw_files()
    t = time.perf_counter()
    gm = load_caffe(proto, weights)
    emit(metric="nsfw_load_s", value=round(time.perf_counter() - t, 3), note="first load in a fresh process")
    t = time.perf_counter()
    load_caffe(proto, weights)
    emit(metric="nsfw_reload_s", value=round(time.perf_counter() - t, 3))
    t = time.perf_counter()
    folded = fold_for_inference(gm)  # recomputes the in-place flags itself
    emit(metric="nsfw_fold_s", value=round(time.perf_counter() - t, 3))

    net = cv2.dnn.readNetFromCaffe(proto, weights)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    cl = torch.channels_last
    graphs = {"plain": (gm, False),
              "plain_cl": (load_caffe(proto, weights).to(memory_format=cl), True),
              "folded": (folded, False),
              "folded_cl": (fold_for_inference(load_caffe(proto, weights)).to(memory_format=cl), True)}

    for batch in (1, 32):
        x = (np.random.default_rng(0).standard_normal((batch, 3, 224, 224)) * 50).astype(np.float32)
        xt = torch.from_numpy(x)

        def cv_run(x=x):
            net.setInput(x)
            return net.forward()

        def ours(g, channels_last, xt=xt):
            def run():
                with torch.inference_mode():
                    return g(xt.contiguous(memory_format=cl) if channels_last else xt)["prob"]
            return run

        fns: dict[str, Callable[[], object]] = {"opencv": cv_run}
        fns.update({name: ours(g, c) for name, (g, c) in graphs.items()})
        reps = args.repeats if batch == 1 else max(3, args.repeats // 2)
        times = interleaved_times(fns, reps)
        med = {n: float(np.median(v)) for n, v in times.items()}
        best = {n: min(v) for n, v in times.items()}
        row = {"metric": "forward_s", "batch": batch, "threads": args.threads, "repeats": reps,
               "loadavg_1min": round(os.getloadavg()[0], 2)}
        row.update({f"median_{n}": round(v, 4) for n, v in med.items()})
        row.update({f"ratio_{n}": round(med[n] / med["opencv"], 3) for n in graphs})
        row.update({f"ratio_min_{n}": round(best[n] / best["opencv"], 3) for n in graphs})
        emit(**row)
        net.setInput(x)
        ref_fc, ref = (np.asarray(o).reshape(batch, -1) for o in net.forward(["fc_nsfw", "prob"]))
        prob_diff, fc_diff = {}, {}
        for n, (g, _) in graphs.items():
            seen: list[torch.Tensor] = []
            hook = layer_modules(g)["fc_nsfw"].register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.clone()))
            try:
                prob = np.asarray(fns[n]()).reshape(batch, -1)
            finally:
                hook.remove()
            prob_diff[n] = float(np.abs(prob - ref).max())
            fc_diff[n] = float(np.abs(seen[0].numpy().reshape(batch, -1) - ref_fc).max() / np.abs(ref_fc).max())
        emit(metric="max_abs_diff_prob_vs_opencv", batch=batch, **prob_diff)
        emit(metric="max_rel_diff_fc_nsfw_vs_opencv", batch=batch, note="pre-softmax, relative to its max |value|",
             **fc_diff)


if __name__ == "__main__":
    main()
