"""Keep freed activation memory in the process for the next batch (glibc only, CLI only).

Why: a CPU forward allocates every layer's output afresh, and glibc serves blocks above its
mmap threshold (at most 32 MiB, and a batch-32 ResNet activation is ~100 MiB) with a fresh
``mmap`` and returns them with ``munmap`` when freed. Each batch then page-faults its
activations in again, zero-filled by the kernel: in the 256-image nsfw job that was ~14 % of
the CPU time, all of it system time. With mmap off for new blocks and no trimming of the heap
top, freed blocks stay mapped and the next batch reuses them (the caching-allocator pattern
ONNX Runtime's arena uses), for a few per cent more peak memory.

One arena (``M_ARENA_MAX=1``) for every thread: the command's helper threads (the read-ahead
of the caffemodel, the exports written side by side) then reuse the memory the calibration
freed instead of each growing an arena of its own -- with per-thread arenas the side-by-side
writes of a VGG-16 job added 170-270 MiB to its peak, with one 8-10 MiB. A user's own
``MALLOC_ARENA_MAX`` is left as it is.

Only the ``amct-torch`` command calls this, for its own process: a library should not change
the allocator policy of a user's program. ``AMCT_TORCH_KEEP_MEMORY=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse; True when the allocator took the settings
    (False on other C libraries or systems, or when turned off by the environment)."""
    if os.environ.get("AMCT_TORCH_KEEP_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # 2**31 - 1: the largest value mallopt takes; freed memory at the heap top is kept
    kept = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
    if "MALLOC_ARENA_MAX" not in os.environ:
        kept = bool(mallopt(M_ARENA_MAX, 1)) and kept
    return kept
