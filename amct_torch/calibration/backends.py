"""Which implementation of the observers' few heavy operations runs on a device.

Why one dispatch: the maths lives once, as sync-free tensor functions in
``amct_torch.algorithms``; a faster implementation (today the compiled CPU kernels of
``amct_torch.kernels``) registers the same named operations (``stream_update``, ``hfmg_update``,
``ifmr_hist_losses``, ``hfmg_search``) and is chosen once per device type, so observers never
test for it. The CPU thread policy (``cpu_threads``) lives here too. docs/algorithms.md,
"Backends"."""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Callable, Optional

import torch

from amct_torch.algorithms import hfmg, streaming

log = logging.getLogger("amct_torch")

#: intra-op threads for the observers' CPU torch work (None: leave torch's setting). The
#: torch part of an update is a few memory-bound passes; with two or more OpenMP threads
#: each pass also pays a fork/join, which on a busy machine waits for a descheduled worker
#: (benchmarks/results/README.md). Results do not depend on it: every reduction is exact.
CPU_THREADS: Optional[int] = 1


@contextlib.contextmanager
def cpu_threads(device: torch.device) -> Iterator[None]:
    """Run the enclosed CPU tensor work with ``CPU_THREADS`` intra-op threads, restoring the
    previous count after (no effect on other devices)."""
    before = torch.get_num_threads()
    if device.type != "cpu" or CPU_THREADS is None or before <= CPU_THREADS:
        yield
        return
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TorchBackend:
    """The tensor formulas of ``amct_torch.algorithms``: every device, no host read."""

    name = "torch"
    ifmr_hist_losses: Optional[Callable] = None
    hfmg_search: Optional[Callable] = None

    def stream_update(self, st: streaming.StreamState, x: torch.Tensor) -> torch.Tensor:
        with cpu_threads(x.device):
            return streaming.update(st, x)

    def hfmg_update(self, counts: torch.Tensor, rng: torch.Tensor, seen: torch.Tensor, x: torch.Tensor):
        with cpu_threads(x.device):
            return hfmg.update(counts, rng, seen, x)


_lock = threading.Lock()
_chosen: dict[str, object] = {}
#: set when CPU data went through the torch formulas because the kernels were unavailable
_fallback = {"used": False, "warned": False}


def _cpu_backend():
    from amct_torch import kernels
    accel = kernels.backend(TorchBackend())
    if accel is None:
        _fallback["used"] = True
        return TorchBackend()
    return accel


def backend_for(device: torch.device):
    """The backend for ``device``'s type, chosen once per process (the CPU's may build the
    kernels: call ``prepare`` before calibration so that no build happens inside a hook)."""
    key = device.type
    b = _chosen.get(key)
    if b is None:
        with _lock:
            b = _chosen.get(key)
            if b is None:
                b = _chosen[key] = _cpu_backend() if key == "cpu" else TorchBackend()
    return b


def prepare(device) -> str:
    """Choose (on the CPU: build, verify and load) the backend for ``device`` now; its name."""
    return backend_for(torch.device(device)).name


def warn_if_slow() -> None:
    """One warning per process when CPU calibration used the torch formulas because the
    kernels were unavailable (not turned off): same results, several times slower."""
    from amct_torch import kernels
    if _fallback["used"] and not _fallback["warned"] and not kernels.turned_off():
        _fallback["warned"] = True
        log.warning("calibrated on the CPU without the compiled histogram kernels (%s): same results, "
                    "several times slower; install a C compiler (gcc/clang) to speed it up",
                    kernels.unavailable_reason())
