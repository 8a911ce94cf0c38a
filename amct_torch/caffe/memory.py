"""Peak activation memory of a loaded net at a batch size, from the declared shapes alone.

Why: the shape rules give every blob's size when the model loads, before any data runs; a model
whose declared sizes cannot fit (a ``pad: 1200`` on an 8×8 input) is refused naming the model
and the layer, not failed with an allocation error blamed on the data. The estimate is the live
float32 blobs at the worst point of the forward plus one blob of the largest size, scaled to the
batch size; ``check_activation_memory`` compares it with what this process may use (the CUDA
device's free memory; on the CPU the smallest of MemAvailable, the cgroup's room and
RLIMIT_AS). The formula: docs/caffe_format.md."""
from __future__ import annotations

import os
import resource
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from amct_torch.errors import ModelError

BYTES_PER_VALUE = 4


@dataclass(frozen=True)
class ActivationEstimate:
    """Per-sample figures of one net (bytes): the live peak and where, the largest blob and
    whose. ``bytes_at(B)`` is the formula of the module docstring."""
    peak_per_sample: float
    peak_layer: Optional[str]
    largest_per_sample: float
    largest_layer: Optional[str]

    def bytes_at(self, batch_size: int) -> float:
        return batch_size * (self.peak_per_sample + self.largest_per_sample)


def estimate_activation_memory(gm: Any) -> ActivationEstimate:
    """The estimate for a graph built by ``load_caffe`` (its nodes carry ``caffe_shape``)."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    size: dict[Any, int] = {}
    for n in nodes:
        shape = n.meta.get("caffe_shape")
        if shape:
            count = 1
            for d in shape:
                count *= int(d)
            size[n] = count
    last = {n: max((order[u] for u in n.users), default=order[n]) for n in nodes}
    declared = next((n.meta.get("caffe_shape") for n in nodes if n.op == "placeholder"), None)
    batch0 = int(declared[0]) if declared and int(declared[0]) > 0 else 1
    live, peak, peak_at = 0, 0, None
    ends: dict[int, int] = {}
    for i, n in enumerate(nodes):
        live += size.get(n, 0)
        ends[last[n]] = ends.get(last[n], 0) + size.get(n, 0)
        if live > peak:
            peak, peak_at = live, n
        live -= ends.pop(i, 0)
    largest = max(size, key=lambda n: size[n], default=None)
    per = BYTES_PER_VALUE / batch0
    return ActivationEstimate(peak * per, None if peak_at is None else peak_at.meta.get("caffe_layer"),
                              (size[largest] if largest is not None else 0) * per,
                              None if largest is None else largest.meta.get("caffe_layer"))


def available_memory(device: Any = None) -> tuple[Optional[int], str]:
    """(bytes this process can still use, where the figure comes from); None when unknown."""
    dev = str(device) if device is not None else "cpu"
    if dev.startswith("cuda"):
        import torch
        free, _ = torch.cuda.mem_get_info(torch.device(dev))
        return int(free), f"free on {dev}"
    found = [(v, w) for v, w in (_mem_available(), _cgroup_room(), _address_space_room()) if v is not None]
    if not found:
        return None, "unknown"
    return min(found)


def declared_sample_shape(gm: Any) -> Optional[tuple[int, ...]]:
    """The declared shape of one sample of the net's first input (without the batch axis)."""
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            shape = n.meta.get("caffe_shape")
            return tuple(int(d) for d in shape[1:]) if shape else None
    return None


def _input_ratio(gm: Any, sample_shape: Optional[Sequence[int]]) -> float:
    """How many times the declared sample's values ``sample_shape`` holds (1 when unknown):
    every blob of a net that takes another input size scales with it."""
    declared = declared_sample_shape(gm)
    if not sample_shape or not declared or len(declared) != len(sample_shape):
        return 1.0
    have, want = 1, 1
    for a, b in zip(sample_shape, declared):
        have, want = have * int(a), want * int(b)
    return have / want if want > 0 else 1.0


def check_activation_memory(gm: Any, batch_size: int, model_file: Optional[str], device: Any = None,
                            available: Optional[int] = None,
                            sample_shape: Optional[Sequence[int]] = None) -> ActivationEstimate:
    """Refuse (ModelError naming ``model_file`` and the layer with the largest blob) a batch
    size whose activations cannot fit in the available memory, suggesting one that does.
    ``sample_shape``: the shape of one sample as the data gives it (after preprocessing: a
    ``--resize`` without ``--crop`` runs the net at that size), when it differs from the
    declared one."""
    est = estimate_activation_memory(gm)
    ratio = _input_ratio(gm, sample_shape)
    if ratio != 1.0:
        est = ActivationEstimate(est.peak_per_sample * ratio, est.peak_layer,
                                 est.largest_per_sample * ratio, est.largest_layer)
    where = "given"
    if available is None:
        available, where = available_memory(device)
    if available is None or est.bytes_at(batch_size) <= available:
        return est
    need = est.bytes_at(batch_size)
    if ratio != 1.0:
        where += f"; the input is {list(sample_shape or ())} per sample after preprocessing"
    fits = int(available // est.bytes_at(1)) if est.bytes_at(1) > 0 else 0
    advice = (f"use a batch size of at most {fits} (--batch-size)" if fits >= 1 else
              "even one sample does not fit: check this layer's pad, stride and the declared "
              "input shape")
    raise ModelError(f"the activations of a batch of {batch_size} need about {_gib(need)} (this "
                     f"layer's output, the largest blob, is {_gib(est.largest_per_sample)} per "
                     f"sample) but {_gib(available)} is available ({where}); {advice}",
                     file=model_file, layer=est.largest_layer)


def check_batch_memory(batch: Any, gm: Any, model_file: Optional[str], device: Any = None) -> None:
    """``check_activation_memory`` at ``batch``'s real size and per-sample shape (its first
    tensor's, a batch being a tensor or a tuple of them)."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) >= 1:
        check_activation_memory(gm, max(int(shape[0]), 1), model_file, device,
                                sample_shape=tuple(int(d) for d in shape[1:]))


def checked_first_batch(batches: Iterable[Any], gm: Any, model_file: Optional[str],
                        device: Any = None) -> Iterator[Any]:
    """``batches`` unchanged, the first one checked (``check_batch_memory``) before it is
    passed on, so before any forward."""
    it = iter(batches)
    first = next(it, None)
    if first is None:
        return
    check_batch_memory(first, gm, model_file, device)
    yield first
    yield from it


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 28 else f"{n / 2 ** 20:.1f} MiB"


def _mem_available() -> tuple[Optional[int], str]:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory"
    except (OSError, ValueError):
        return None, ""


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _cgroup_room() -> tuple[Optional[int], str]:
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 2 ** 60:
            return max(cap - used, 0), "cgroup memory limit"
    return None, ""


def _address_space_room() -> tuple[Optional[int], str]:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None, ""
    mapped = 0
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return max(soft - mapped, 0), "address-space limit"
