"""Calibration-algorithm benchmarks; prints one JSON line per measurement.

    python benchmarks/bench_algorithms.py [--device cpu|cuda] [--quick]

Side by side: HFMG vs torch.ao HistogramObserver, IFMR exact batched vs a candidate loop,
IFMR streaming vs exact (time, peak memory), update throughput vs torch.aminmax (on one
cached tensor, and on a stream of distinct batches as a calibration sees them).
``streaming_agreement(tensors)`` compares streaming with exact on any list of activations
(reusable on real activations).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from amct_torch.algorithms.ifmr import candidate_grid, candidate_ratios, ifmr_exact, percentile_k
from amct_torch.algorithms.quant import fake_quant
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int = 3) -> float:
    fn(); sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter(); fn(); sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def mse(x: torch.Tensor, scale: float, offset: int) -> float:
    return float(((fake_quant(x, scale, offset) - x) ** 2).double().mean())


def batches(device: str, n: int, size: int, kind: str = "relu", seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(size, generator=g)
        if kind == "relu":
            x = torch.relu(x + 0.3)
        elif kind == "heavy":
            x = x / torch.rand(size, generator=g).clamp_min(0.05)
        out.append(x.to(device))
    return out


def streaming_agreement(tensors: Sequence[Sequence[torch.Tensor]], asymmetric: bool = True,
                        details: Optional[dict] = None, names: Optional[Sequence[str]] = None) -> dict:
    """For each entry (one layer: a list of activation batches) compute exact and streaming
    IFMR and report agreement: same factors, step distance, MSE ratio. ``details`` (a dict)
    receives one row per layer, keyed by ``names`` (or the index)."""
    same, worst_steps, worst_mse = 0, 0, 0.0
    for n_layer, layer in enumerate(tensors):
        layer = [layer] if isinstance(layer, torch.Tensor) else list(layer)
        e, s = IfmrExactObserver("l", asymmetric=asymmetric), IfmrStreamingObserver("l", asymmetric=asymmetric)
        for x in layer:
            e.update(x); s.update(x)
        (se, oe), (ss, os_) = e.compute(), s.compute()
        flat = torch.cat([x.reshape(-1).float() for x in layer])
        ref = ifmr_exact(flat, asymmetric=asymmetric)
        ratios = candidate_ratios(0.7, 1.3, 0.01, flat.device)
        _, _, scales = candidate_grid(torch.tensor(ref.max_init), torch.tensor(ref.min_init), ratios, asymmetric)
        idx_s = int(torch.argmin((scales.cpu() - ss).abs()))
        steps = abs(idx_s - ref.index)
        worst_steps = max(worst_steps, steps)
        me, ms = mse(flat, se, oe), mse(flat, ss, os_)
        excess = ms / me - 1 if me > 0 else 0.0
        worst_mse = max(worst_mse, excess)
        same += (se, oe) == (ss, os_)
        if details is not None:
            key = names[n_layer] if names is not None else n_layer
            details[key] = {"elements": flat.numel(), "exact_scale": se, "exact_offset": oe,
                            "streaming_scale": ss, "streaming_offset": os_, "step_distance": steps,
                            "mse_excess": excess}
    return {"cases": len(tensors), "same_fraction": same / max(1, len(tensors)),
            "max_step_distance": worst_steps, "max_mse_excess": worst_mse}


def bench_hfmg(device: str, size: int, nb: int, rounds: int = 5) -> None:
    """Ours and torch.ao's HistogramObserver on the same batches, timed alternately over
    ``rounds`` fresh pairs of observers; medians (one pass of either varies ±30 % with what ran
    before it on this machine)."""
    from torch.ao.quantization.observer import HistogramObserver
    data = batches(device, nb, size, "relu")
    bins = 2048
    times = {k: [] for k in ("ours_update_s", "ours_compute_s", "torch_update_s", "torch_compute_s")}
    for _ in range(rounds):
        ours = HfmgObserver("l", bins)
        t0 = time.perf_counter()
        for x in data:
            ours.update(x)
        sync(device); times["ours_update_s"].append((time.perf_counter() - t0) / nb)
        t0 = time.perf_counter(); s, o = ours.compute(); times["ours_compute_s"].append(time.perf_counter() - t0)
        ref = HistogramObserver(bins=bins, dtype=torch.qint8, qscheme=torch.per_tensor_affine).to(device)
        t0 = time.perf_counter()
        for x in data:
            ref(x)
        sync(device); times["torch_update_s"].append((time.perf_counter() - t0) / nb)
        t0 = time.perf_counter(); rs, rz = ref.calculate_qparams(); times["torch_compute_s"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_batch = [(tu + tc / nb) / (ou + oc / nb) for ou, oc, tu, tc in
                 zip(times["ours_update_s"], times["ours_compute_s"], times["torch_update_s"], times["torch_compute_s"])]
    flat = torch.cat(data)
    emit(bench="hfmg_vs_torch_histogram", device=device, bins=bins, elements_per_batch=size, batches=nb,
         rounds=rounds, **med, speedup_per_batch=statistics.median(per_batch),
         speedups=[round(v, 2) for v in per_batch],
         ours_mse=mse(flat, s, o), torch_mse=mse(flat, float(rs), int(rz) - 0))


def loop_ifmr(x: torch.Tensor, asymmetric: bool = True) -> int:
    """AMCT's way: one candidate at a time over the whole tensor."""
    xs = x.reshape(-1)
    k = percentile_k(xs.numel(), 0.999999)
    mx = torch.topk(xs, k).values[k - 1].clamp_min(0)
    mn = torch.topk(xs, k, largest=False).values[k - 1].clamp_max(0)
    best, best_loss = 0, None
    ratios = candidate_ratios(0.7, 1.3, 0.01, x.device)
    lo, hi, s = candidate_grid(mx, mn, ratios, asymmetric)
    for i in range(ratios.numel()):
        q = torch.round(torch.clamp(xs, lo[i], hi[i]) / s[i]) * s[i]
        loss = float(((q - xs) ** 2).double().sum())
        if best_loss is None or loss < best_loss:
            best, best_loss = i, loss
    return best


def bench_ifmr_exact(device: str, sizes: Sequence[int], rounds: int = 5) -> None:
    """Batched (level-edge) exact IFMR vs the candidate loop: interleaved rounds, medians and
    minimums, the load average alongside (a busy machine shows there)."""
    for kind in ("normal", "relu"):
        for size in sizes:
            x = batches(device, 1, size, kind)[0]
            ours, loop = [], []
            for _ in range(rounds):
                ours.append(timed(lambda x=x: ifmr_exact(x), device, reps=1))
                loop.append(timed(lambda x=x: loop_ifmr(x), device, reps=1))
            emit(bench="ifmr_exact_batched_vs_loop", device=device, kind=kind, elements=size,
                 batched_s=statistics.median(ours), loop_s=statistics.median(loop),
                 batched_min_s=min(ours), loop_min_s=min(loop),
                 speedup=statistics.median(loop) / statistics.median(ours),
                 same_choice=ifmr_exact(x).index == loop_ifmr(x), load_avg_1m=os.getloadavg()[0])


def state_bytes(obs) -> int:
    return sum(v.numel() * v.element_size() for v in obs.state_dict().values())


def _vm_kb(field: str) -> int:
    """A VmRSS/VmHWM figure of this process in kB (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def streaming_vs_exact_run(device: str, mode: str, nb: int, size: int) -> dict:
    """One observer fed ``nb`` batches made one at a time (so the data's own memory does not
    grow with nb), then its factors: times, the state's size and the peak memory the run added
    — the CUDA allocator's peak on a GPU, else the process's peak RSS (VmHWM) over its RSS
    before the first batch (run in a fresh process: see ``bench_streaming_vs_exact``)."""
    cls = IfmrExactObserver if mode == "exact" else IfmrStreamingObserver
    obs = cls("l")
    warm = cls("w")
    warm.update(batches(device, 1, 4096, "relu", seed=1)[0]); warm.compute()   # kernels, allocator
    g = torch.Generator().manual_seed(nb)
    if device.startswith("cuda"):
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    base_kb = _vm_kb("VmRSS")
    t_upd = 0.0
    for _ in range(nb):
        x = torch.relu(torch.randn(size, generator=g) + 0.3).to(device)
        t0 = time.perf_counter(); obs.update(x); sync(device); t_upd += time.perf_counter() - t0
        del x
    t0 = time.perf_counter(); s, o = obs.compute(); t_cmp = time.perf_counter() - t0
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = max(0, _vm_kb("VmHWM") - base_kb) * 1024
    return dict(bench="ifmr_streaming_vs_exact", device=device, mode=mode, batch_num=nb, elements_per_batch=size,
                update_s=t_upd, compute_s=t_cmp, state_bytes=state_bytes(obs), peak_added_bytes=peak,
                peak_measured_as="cuda max_memory_allocated" if device.startswith("cuda") else "VmHWM - VmRSS",
                scale=s, offset=o)


def bench_streaming_vs_exact(device: str, size: int, batch_nums: Sequence[int]) -> None:
    """Streaming vs exact IFMR for several batch_num: each run in a fresh process, so that one
    run's freed memory (kept by the allocator) does not hide the next one's peak."""
    import subprocess
    for nb in batch_nums:
        for mode in ("exact", "streaming"):
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child", mode, str(nb),
                                  str(size), "--device", device], capture_output=True, text=True)
            lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
            print(lines[-1] if lines else json.dumps({"bench": "ifmr_streaming_vs_exact", "mode": mode,
                                                      "batch_num": nb, "error": res.stderr[-300:]}), flush=True)


#: updates before a streaming observer's time is taken: feeding one tensor again and again,
#: the top/bottom buffers keep taking candidates for about ten updates (0.49 → 0.40 ms at 1M)
SETTLE = 12


def bench_throughput(device: str, size: int) -> None:
    """Per-element cost of ``update`` on a tensor it has seen before (range and top/bottom
    buffers settled: the steady state of a calibration), against one aminmax pass over the
    same tensor (on the CPU a 1M–4M tensor is then in cache: aminmax reads it at cache speed)."""
    x = batches(device, 1, size, "normal")[0]
    t_ref = timed(lambda: torch.aminmax(x), device, reps=5)
    for name, mk in (("ifmr_streaming", lambda: IfmrStreamingObserver("l")), ("hfmg", lambda: HfmgObserver("l", 4096)),
                     ("ifmr_exact", lambda: IfmrExactObserver("l"))):
        obs = mk()
        for _ in range(1 if name == "ifmr_exact" else SETTLE):     # exact keeps every batch
            obs.update(x)
        t = timed(lambda obs=obs: obs.update(x), device, reps=5)
        emit(bench="update_throughput", device=device, observer=name, elements=size,
             elements_per_s=size / t, aminmax_elements_per_s=size / t_ref, relative_to_aminmax=t_ref / t)


def bench_stream_throughput(device: str, size: int, nb: int = 6, rounds: int = 3) -> None:
    """The same ratio on what a calibration feeds an observer: ``nb`` distinct batches in
    turn. aminmax over each batch of the stream, then the updates over each batch (so that
    neither finds the batch left in cache by the other), second pass of a settled observer;
    medians over ``rounds`` of the summed times."""
    data = batches(device, nb, size, "normal", seed=3)
    for name, mk in (("ifmr_streaming", lambda: IfmrStreamingObserver("l")), ("hfmg", lambda: HfmgObserver("l", 4096))):
        obs = mk()
        for x in data:
            obs.update(x)
        ref, ours = [], []
        for _ in range(rounds):
            t_a = 0.0
            for x in data:
                t0 = time.perf_counter(); torch.aminmax(x); sync(device); t_a += time.perf_counter() - t0
            t_u = 0.0
            for x in data:
                t0 = time.perf_counter(); obs.update(x); sync(device); t_u += time.perf_counter() - t0
            ref.append(t_a)
            ours.append(t_u)
        t_ref, t = statistics.median(ref), statistics.median(ours)
        emit(bench="update_throughput_stream", device=device, observer=name, elements=size, batches=nb,
             elements_per_s=nb * size / t, aminmax_elements_per_s=nb * size / t_ref, relative_to_aminmax=t_ref / t)


def bench_agreement(device: str) -> None:
    g = torch.Generator().manual_seed(7)
    cases = []
    for kind in ("normal", "relu", "heavy"):
        for i in range(8):
            cases.append(batches(device, 3, 50000, kind, seed=100 * i + len(kind)))
    cases.append([torch.full((10000,), 0.3, device=device)])
    cases.append([(torch.randn(20000, generator=g) * 1e-6).to(device)])
    emit(bench="ifmr_streaming_agreement_synthetic", device=device, **streaming_agreement(cases))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", nargs=3, metavar=("MODE", "BATCH_NUM", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.memory_child:
        mode, nb, size = a.memory_child
        emit(**streaming_vs_exact_run(a.device, mode, int(nb), int(size)))
        return
    size = 1 << 20 if a.quick else 1 << 22
    from amct_torch.kernels import native
    # build/load the CPU histogram kernels before any timing (first use compiles them once)
    emit(bench="histogram_kernels", device=a.device,
         kernels="native" if native.library() is not None else f"torch ({native.unavailable_reason()})")
    for n in (size // 4, size, size * 4):
        bench_throughput(a.device, n)
    for n in (size // 4, size, size * 4):
        bench_stream_throughput(a.device, n)
    bench_hfmg(a.device, size // 4, 8)
    bench_ifmr_exact(a.device, (size // 16,) if a.quick else (size // 4, size))
    bench_streaming_vs_exact(a.device, size // 16, (4, 16, 64))
    bench_agreement(a.device)


if __name__ == "__main__":
    main()
