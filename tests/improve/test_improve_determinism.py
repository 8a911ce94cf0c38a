"""The same inputs and options give byte-identical records and models, with and without
``--improve``, across runs, torch thread counts (1, 2, and OMP_NUM_THREADS) and processes: each
setting runs the job in its own Python process on a net whose layers are large enough for
torch's multi-threaded kernels and reductions to split their work."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.caffe_nets import make_net, rand

BODY = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 16 kernel_size: 3 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" convolution_param { num_output: 16 kernel_size: 3 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "fc" type: "InnerProduct" bottom: "conv2" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

JOB = """
import hashlib, json, os, sys
import numpy as np, torch
import amct_torch
proto, weights, data, out, threads = sys.argv[1:6]
if threads != "env":
    torch.set_num_threads(int(threads))
x = np.load(data)
digests = {}
for improve in (None, "all"):
    prefix = os.path.join(out, improve or "default", "m")
    r = amct_torch.quantize(proto, weights, x, output=prefix, batch_num=4, batch_size=8, device="cpu",
                            quiet=True, report=False, save_type="Both", onnx=False, improve=improve)
    for k, f in sorted(r.files.items()):
        digests[f"{improve}:{k}"] = hashlib.sha256(open(f, "rb").read()).hexdigest()
    digests[f"{improve}:kept"] = (r.improvement or {}).get("kept")
print(json.dumps({"threads": torch.get_num_threads(), "digests": digests}))
"""


def run(tmp_path, proto, weights, data, name, threads, omp=None) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    out = tmp_path / name
    res = subprocess.run([sys.executable, "-c", JOB, proto, weights, data, str(out), threads],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_outputs_identical_across_runs_threads_and_processes(tmp_path):
    blobs = {"conv1": [rand(16, 3, 3, 3, seed=1, scale=0.3), rand(16, seed=2, scale=0.1)],
             "conv2": [rand(16, 16, 3, 3, seed=3, scale=0.15), rand(16, seed=4, scale=0.1)],
             "fc": [rand(10, 16 * 16 * 16, seed=5, scale=0.02), rand(10, seed=6, scale=0.1)]}
    proto, weights = make_net(tmp_path, BODY, {"data": [1, 3, 20, 20]}, blobs)
    data = str(tmp_path / "x.npy")
    np.save(data, (rand(32 + 64, 3, 20, 20, seed=7) + 0.3).astype(np.float32))
    runs = [run(tmp_path, proto, weights, data, "t1", "1"), run(tmp_path, proto, weights, data, "t2", "2"),
            run(tmp_path, proto, weights, data, "omp3", "env", omp="3")]
    assert [r["threads"] for r in runs[:2]] == [1, 2]
    first = runs[0]["digests"]
    assert {"None:record", "all:record", "all:deploy_weights", "all:fake_quant_weights"} <= set(first), first
    for r in runs[1:]:
        assert r["digests"] == first, (r["threads"], {k: (first[k], v) for k, v in r["digests"].items() if first.get(k) != v})
    # the improved model differs from the default one (so the comparison covers the improvements)
    assert first["all:kept"] != "default" and first["all:deploy_weights"] != first["None:deploy_weights"]
