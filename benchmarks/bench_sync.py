"""Host synchronisations per calibration batch (goal 0), and on a GPU the calibration cost.

Prints JSON lines:
- ``host_reads_per_batch`` per observer kind and for a whole nsfw ResNet-50 calibration forward
  (hooks feeding 53 observers), counted on real tensors with the torch backend — the path
  every non-CPU device takes (tests/helpers/sync.SyncCounter: ``.item()``, ``.tolist()``,
  ``float()/bool()`` of a tensor, nonzero/masked gathers);
- with ``--device cuda``: calibration forward time / float forward time at batch 32 (goal
  ≤ 1.1), and whether one observer update can be captured in a CUDA graph.

Usage: python benchmarks/bench_sync.py [--device cuda] [--batch 32] [--batches 4]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from amct_torch.calibration import backends  # noqa: E402
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver  # noqa: E402
from conftest import nsfw_dir  # noqa: E402
from helpers.sync import calibration_model, count_syncs  # noqa: E402


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def nsfw_files():
    d = nsfw_dir()
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


def observer_reads(device: str, batches: int) -> None:
    backends._chosen[torch.device(device).type] = backends.TorchBackend()
    g = torch.Generator(device=device).manual_seed(0)
    for name, make in (("ifmr_streaming", lambda: IfmrStreamingObserver("l")),
                       ("hfmg", lambda: HfmgObserver("l", 4096)), ("ifmr_exact", lambda: IfmrExactObserver("l"))):
        obs = make()
        xs = [torch.randn(8, 64, 56, 56, generator=g, device=device) * (i + 1) for i in range(batches)]
        reads, where, _ = count_syncs(lambda obs=obs, xs=xs: [obs.update(x) for x in xs])
        emit(bench="host_reads_per_batch", what=name, device=device, reads=reads / batches, where=where)


def forward_reads(device: str, batch: int, batches: int) -> None:
    backends._chosen[torch.device(device).type] = backends.TorchBackend()
    with tempfile.TemporaryDirectory() as tmp:
        model, graph = calibration_model(tmp, *nsfw_files(), batch_num=batches + 100)
        model.to(device)
        x = torch.randn(batch, 3, 224, 224, device=device)
        with torch.no_grad():
            model(x)                                         # warm-up (first-batch allocations)
            reads, where, _ = count_syncs(lambda: [model(x) for _ in range(batches)])
        emit(bench="host_reads_per_batch", what="nsfw_calibration_forward", device=device, batch=batch,
             observers=len(graph.session.observers), reads=reads / batches, where=where)


def cuda_ratio(batch: int, batches: int) -> None:
    """Calibration forward / float forward on CUDA (same model, same data)."""
    from amct_torch import load_caffe
    float_model = load_caffe(*nsfw_files()).cuda().eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda")

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(batches):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / batches

    with torch.no_grad():
        t_float = timed(lambda: float_model(x))
        with tempfile.TemporaryDirectory() as tmp:
            model, _ = calibration_model(tmp, *nsfw_files(), batch_num=10 * batches + 100)
            model.cuda()
            t_cal = timed(lambda: model(x))
    emit(bench="cuda_calibration_over_float", batch=batch, float_s=t_float, calibration_s=t_cal,
         ratio=t_cal / t_float, goal=1.1)


def cuda_graph_capture() -> None:
    """Can one observer update be captured in a CUDA graph (no sync, no host-side branching)?"""
    for name, make in (("ifmr_streaming", lambda: IfmrStreamingObserver("l")), ("hfmg", lambda: HfmgObserver("l"))):
        obs = make()
        x = torch.randn(8, 64, 56, 56, device="cuda")
        obs.update(x)                                       # allocate the state outside the graph
        ok, why = True, ""
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    obs.update(x)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - report, do not stop the benchmark
            ok, why = False, f"{type(exc).__name__}: {str(exc)[:200]}"
        emit(bench="cuda_graph_capture", observer=name, ok=ok, why=why)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=3)
    a = ap.parse_args()
    observer_reads(a.device, a.batches)
    forward_reads(a.device, a.batch, a.batches)
    if a.device == "cuda":
        cuda_ratio(32, 10)
        cuda_graph_capture()


if __name__ == "__main__":
    main()
