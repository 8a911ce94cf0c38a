"""keep_freed_memory: after it, repeated CPU forwards reuse their activation memory instead of
page-faulting fresh memory in every batch (counted by the kernel: minor page faults)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = """
import resource, sys, torch
from amct_torch.runtime.malloc_tuning import keep_freed_memory
if sys.argv[1] == "1":
    assert keep_freed_memory()
torch.set_num_threads(1)  # one thread, one heap: the count does not depend on the machine's load
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                          torch.nn.Conv2d(32, 16, 3, padding=1))
x = torch.randn(8, 3, 256, 256)  # activations of 64 MiB: above glibc's largest mmap threshold (32 MiB)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with torch.no_grad():
    for _ in range(2):
        net(x)
    f0 = faults()
    for _ in range(4):
        net(x)
print(faults() - f0)
"""


def _faults(keep: bool) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # no thread pools to race
    out = subprocess.run([sys.executable, "-c", CODE, "1" if keep else "0"], capture_output=True,
                         text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt (Linux only)")
def test_forwards_reuse_memory_after_keep_freed_memory():
    pages = 8 * 32 * 256 * 256 * 4 // 4096  # one activation, in 4 KiB pages
    default, kept = _faults(False), _faults(True)
    assert default >= 4 * pages  # the default: every forward faults its activations in afresh
    # kept: at most one late heap growth in four forwards, which may hold both 64 MiB activations
    # (the first convolution's output and the ReLU's); seen once on a loaded machine
    assert kept <= 2 * pages < default // 4


def test_turned_off_by_the_environment(monkeypatch):
    from amct_torch.runtime.malloc_tuning import keep_freed_memory
    monkeypatch.setenv("AMCT_TORCH_KEEP_MEMORY", "0")
    assert keep_freed_memory() is False


THREAD_CODE = """
import ctypes, resource, sys, threading
from amct_torch.runtime.malloc_tuning import keep_freed_memory
if sys.argv[1] == "1":
    assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 16 << 20
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks = [libc.malloc(size) for _ in range(8)]  # 8 x 16 MiB, touched and freed by the main thread
for b in blocks:
    ctypes.memset(b, 1, size)
for b in blocks:
    libc.free(b)
out = {}
def helper():
    f0 = faults()
    got = [libc.malloc(size) for _ in range(8)]
    for b in got:
        ctypes.memset(b, 1, size)
    out["faults"] = faults() - f0
t = threading.Thread(target=helper)
t.start(); t.join()
print(out["faults"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt (Linux only)")
def test_a_helper_thread_reuses_what_the_main_thread_freed():
    """The side-by-side exports and the read-ahead run on helper threads: with one arena their
    blocks come from the memory the main thread freed, not from a new arena's fresh pages."""
    def faults(keep: bool, arenas: str = "") -> int:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        if arenas:
            env["MALLOC_ARENA_MAX"] = arenas
        out = subprocess.run([sys.executable, "-c", THREAD_CODE, "1" if keep else "0"],
                             capture_output=True, text=True, check=True, env=env)
        return int(out.stdout.strip().splitlines()[-1])

    pages = 8 * (16 << 20) // 4096
    default, kept = faults(False), faults(True)
    assert default >= pages // 2  # an arena of its own (or fresh mappings): faulted in afresh
    assert kept < pages // 100  # the main thread's freed blocks, already in memory
    assert faults(True, arenas="8") >= pages // 2  # the user's own MALLOC_ARENA_MAX is kept
