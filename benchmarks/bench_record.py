"""Record file speed: write weight factors of 1,000 layers, then merge activation factors into
that record (read -> update -> atomic rewrite), then read + validate it. One JSON line per
measurement (best of ``--repeat`` runs)."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from amct_torch.config.layers import LayerInfo
from amct_torch.record import merge_activation_factors, read_record, validate_record, write_weight_factors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--channels", type=int, default=64, help="scale_w values per layer")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    names = [f"conv_{i}" for i in range(args.layers)]
    weights = {n: ((rng.random(args.channels) + 0.01).astype(np.float32).tolist(),
                   [0] * args.channels) for n in names}
    acts = {n: (float(np.float32(rng.random() + 0.01)), int(rng.integers(-128, 128)), 64, 56, 56)
            for n in names}
    layers = [LayerInfo(n, "Convolution", True, True, args.channels) for n in names]
    best = {"write_weight_factors": float("inf"), "merge_activation_factors": float("inf"),
            "read_and_validate": float("inf")}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "record.txt")
        for _ in range(args.repeat):
            if os.path.exists(path):
                os.unlink(path)
            t0 = time.perf_counter()
            write_weight_factors(path, weights)
            t1 = time.perf_counter()
            merge_activation_factors(path, acts)
            t2 = time.perf_counter()
            validate_record(read_record(path), layers, path)
            t3 = time.perf_counter()
            for k, v in zip(best, (t1 - t0, t2 - t1, t3 - t2)):
                best[k] = min(best[k], v)
        size = os.path.getsize(path)
    for k, v in best.items():
        print(json.dumps({"bench": "record", "op": k, "layers": args.layers,
                          "channels": args.channels, "seconds": round(v, 4),
                          "file_bytes": size}))
    print(json.dumps({"bench": "record", "op": "write_then_merge", "layers": args.layers,
                      "channels": args.channels,
                      "seconds": round(best["write_weight_factors"] + best["merge_activation_factors"], 4)}))


if __name__ == "__main__":
    main()
