"""The whole `amct-torch calibrate` job of two git revisions side by side (before/after a change).

Each revision is checked out into a temporary worktree and run with this venv's Python
(PYTHONPATH pointing at the worktree; -P keeps the current folder off sys.path), alternating, on the same nsfw ResNet-50 and the same
natural images as benchmarks/bench_job.py. Prints JSON lines: wall, CPU and peak RSS per run,
the medians and the after/before ratio per size, and whether the records are byte-identical.

Usage: python benchmarks/bench_revisions.py BEFORE AFTER [--sizes 32x8,256x32] [--repeats 3] [--onnx]
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_job import make_images, nsfw_files, ours_cmd, run_child  # noqa: E402


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def worktree(rev: str, where: str) -> str:
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", where, rev], check=True,
                   capture_output=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--sizes", default="32x8,256x32", help="images x batch, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--onnx", action="store_true", help="the job with --onnx (both ONNX models written)")
    a = ap.parse_args()
    proto, weights = nsfw_files()
    with tempfile.TemporaryDirectory() as work:
        trees = {}
        try:
            for tag, rev in (("before", a.before), ("after", a.after)):
                trees[tag] = worktree(rev, os.path.join(work, tag))
            exe = [sys.executable, "-P", "-c", "import sys; from amct_torch.cli import main; sys.exit(main())"]
            for size in a.sizes.split(","):
                n, batch = (int(v) for v in size.split("x"))
                images = os.path.join(work, f"img{n}")
                make_images(images, n)
                rows = {"before": [], "after": []}
                for rep in range(a.repeats):
                    for tag in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                        out = os.path.join(work, f"out_{tag}_{n}", "nsfw")
                        cmd = exe + ours_cmd(proto, weights, images, batch, n, out, False, onnx=a.onnx)[1:]
                        env = dict(os.environ, PYTHONPATH=trees[tag])
                        r = run_child(cmd, env=env)
                        r.pop("stdout")
                        rows[tag].append(r)
                        emit(bench="revision_job", rev=tag, images=n, batch=batch, **r)
                med = {t: statistics.median(x["wall_s"] for x in rows[t]) for t in rows}
                cpu = {t: statistics.median(x["cpu_s"] for x in rows[t]) for t in rows}
                peak = {t: statistics.median(x["peak_rss_mib"] for x in rows[t]) for t in rows}
                same = filecmp.cmp(os.path.join(work, f"out_before_{n}", "nsfw_record.txt"),
                                   os.path.join(work, f"out_after_{n}", "nsfw_record.txt"), shallow=False)
                emit(bench="revision_job_summary", images=n, batch=batch, before=a.before, after=a.after,
                     wall_before_s=med["before"], wall_after_s=med["after"], ratio=round(med["after"] / med["before"], 3),
                     cpu_before_s=cpu["before"], cpu_after_s=cpu["after"], peak_before_mib=peak["before"],
                     peak_after_mib=peak["after"], onnx=a.onnx, records_identical=same)
        finally:
            for where in trees.values():
                subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", where], capture_output=True)


if __name__ == "__main__":
    main()
