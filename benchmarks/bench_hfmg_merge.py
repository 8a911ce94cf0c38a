"""HFMG merge vs the sequential rule (docs/algorithms.md, "HFMG"): how far merging shard observers (several
GPUs, resume) lands from one observer fed every batch in order. Prints JSON lines.

    python benchmarks/bench_hfmg_merge.py

Per distribution and shard count: histogram mass that lands in a different bin (half the L1
distance / total), relative scale difference, offset difference, and the 8-bit fake-quant
L2 error (MSE over all data) of merged vs sequential factors.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from amct_torch.calibration.observers import HfmgObserver
from bench_algorithms import emit, mse


def data(kind: str, n: int, size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(size, generator=g) * (1 + 0.1 * i)     # ranges differ per batch
        if kind == "relu":
            x = torch.relu(x + 0.3)
        elif kind == "heavy":
            x = x / torch.rand(size, generator=g).clamp_min(0.05)
        elif kind == "shifted":
            x = x + 0.5 * i
        out.append(x)
    return out


def main() -> None:
    for kind in ("normal", "relu", "heavy", "shifted"):
        for bins in (1024, 4096):
            for shards in (2, 4, 8):
                batches = data(kind, 8, 1 << 17, seed=bins + shards)
                seq = HfmgObserver("l", bins)
                for x in batches:
                    seq.update(x)
                parts = []
                for k in range(shards):
                    o = HfmgObserver("l", bins)
                    for x in batches[k::shards]:
                        o.update(x)
                    parts.append(o)
                merged = parts[0]
                for o in parts[1:]:
                    merged.merge(o)
                moved = float((seq.counts - merged.counts).abs().sum()) / 2 / float(seq.counts.sum())
                (s1, o1), (s2, o2) = seq.compute(), merged.compute()
                flat = torch.cat(batches)
                m1, m2 = mse(flat, s1, o1), mse(flat, s2, o2)
                emit(bench="hfmg_merge_vs_sequential", kind=kind, bins=bins, shards=shards,
                     mass_moved_fraction=moved, scale_rel_diff=abs(s2 - s1) / s1, offset_diff=o2 - o1,
                     mse_sequential=m1, mse_merged=m2, mse_ratio=m2 / m1)


if __name__ == "__main__":
    main()
