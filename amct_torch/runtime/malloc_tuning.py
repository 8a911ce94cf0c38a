"""Keep freed activation memory in the process for the next batch (glibc only, CLI only).

Why: glibc serves large blocks with a fresh ``mmap`` and returns them on free, so each CPU batch
page-faults its activations in again, zero-filled by the kernel (~14 % of the CPU time of the
256-image nsfw job). With mmap off for new blocks, no trimming and one arena for every thread
(``M_ARENA_MAX=1``: helper threads reuse what the calibration freed), the next batch reuses the
memory. Only the ``amct-torch`` command calls this, for its own process; a user's own
``MALLOC_ARENA_MAX`` is kept, and ``AMCT_TORCH_KEEP_MEMORY=0`` turns it off. docs/performance.md."""
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
