"""Cost of ``--improve all`` against AMCT's default job on the nsfw ResNet-50-1by2: 32
calibration crops (8 x 4) followed by 64 more that the improvements' guard judges on, the same
data for both jobs, CPU seconds of the process (every thread) and wall seconds, side by side in
one process. One JSON line per repetition, then the medians and their ratio.

    python benchmarks/bench_improve_cost.py [--reps 3] [--device cpu] [--outputs]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amct_torch  # noqa: E402
import bench_fidelity as fid  # noqa: E402 - the crops
from nsfw_data import nsfw_files  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--outputs", action="store_true",
                    help="both jobs write what calibrate writes by default (the Caffe models and the per-layer "
                         "report) instead of the record alone")
    args = ap.parse_args()
    imgs = fid.natural_images()
    proto, weights = nsfw_files()
    data = np.concatenate([fid.crops(imgs, 32, seed=1), fid.crops(imgs, 64, seed=3)]).astype(np.float32)
    kw = dict(batch_num=4, batch_size=8, quiet=True, device=args.device)
    if not args.outputs:
        kw.update(save_type=None, report=False)
    tmp = tempfile.mkdtemp(prefix="bench_improve_cost_")
    got: dict[str, list[tuple[float, float]]] = {"default": [], "all": []}
    for rep in range(args.reps):
        for name in got:
            c, t = time.process_time(), time.time()
            r = amct_torch.quantize(proto, weights, data, output=os.path.join(tmp, name, "m"),
                                    improve=None if name == "default" else name, **kw)
            got[name].append((time.process_time() - c, time.time() - t))
            print(json.dumps({"bench": "improve_cost_nsfw", "rep": rep, "job": name,
                              "cpu_s": round(got[name][-1][0], 2), "wall_s": round(got[name][-1][1], 2),
                              "kept": (r.improvement or {}).get("kept")}), flush=True)
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in got.items()}
    print(json.dumps({"bench": "improve_cost_nsfw_summary", "reps": args.reps, "outputs": args.outputs,
                      "cpu_s": {k: round(v[0], 2) for k, v in med.items()},
                      "wall_s": {k: round(v[1], 2) for k, v in med.items()},
                      "all_over_default_cpu": round(med["all"][0] / med["default"][0], 2),
                      "all_over_default_wall": round(med["all"][1] / med["default"][1], 2)}))


if __name__ == "__main__":
    main()
