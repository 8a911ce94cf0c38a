"""Building and loading ``hist_kernels.c`` (used by ``native.py``).

Built on first use with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``; about
a second) into a per-user cache (``$AMCT_TORCH_CACHE``, else
``$XDG_CACHE_HOME/amct_torch``, else ``~/.cache/amct_torch``; a private per-user temp folder
when that is not writable), keyed by the source, the compiler, the flags and the platform,
and written atomically so that concurrent processes (torchrun ranks) can race safely.
With ``-fopenmp`` the library's ``libgomp.so.1`` resolves to the copy torch already loaded, so
the kernels run on torch's own worker threads; a compiler without OpenMP gets a serial build
(clang where its runtime, libomp, is not installed: ``-fopenmp=libgomp`` would link libgomp
but, in clang 14, generate no parallel code).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

log = logging.getLogger("amct_torch")

SOURCE = Path(__file__).with_name("hist_kernels.c")
#: every file of the one compilation unit (SOURCE includes the others): the cache key hashes them all
SOURCES = [SOURCE, SOURCE.with_name("hist_select.h"), SOURCE.with_name("hist_lanes.h")]
FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fPIC", "-shared"]


def turned_off() -> bool:
    """True when ``AMCT_TORCH_NATIVE`` says no (0, false, no, off)."""
    return os.environ.get("AMCT_TORCH_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    env = os.environ.get("AMCT_TORCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "amct_torch"


def writable_folder(folder: Path) -> Path:
    """``folder`` (created) if this process can write there, else a private per-user temp
    folder (containers often run with a read-only or missing home). The temp folder must be
    ours and closed to others — a library loaded from a folder others can write to would
    run their code."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    uid = os.getuid() if hasattr(os, "getuid") else None
    tmp = Path(tempfile.gettempdir()) / f"amct_torch-{uid if uid is not None else 'user'}"
    try:
        tmp.mkdir(mode=0o700, exist_ok=True)
        st = tmp.stat()
        private = uid is None or (st.st_uid == uid and not st.st_mode & 0o022)
        if private and os.access(tmp, os.W_OK):
            return tmp
    except OSError:
        pass
    raise RuntimeError(f"no writable private folder for the build ({folder}, {tmp})")


def find_compiler() -> Optional[str]:
    """The C compiler to build with: ``$CC`` if set (None if it does not resolve), else the
    first of cc, gcc, clang on the PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc.split()[0]) if cc.split() else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def build(cc: str) -> Path:
    """Compile (or find in the cache) the kernels: with OpenMP if the compiler can, else
    without (the multi-threaded entry points then run their slices one after the other)."""
    errors = []
    for flags in (FLAGS + ["-fopenmp"], FLAGS):
        try:
            return build_with(cc, flags)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            if str(exc) not in errors:
                errors.append(str(exc))
    raise RuntimeError("; ".join(errors))


def build_with(cc: str, flags: List[str]) -> Path:
    """Compile with ``flags`` into the cache (or find it there); the built file's path."""
    src = b"\0".join(p.read_bytes() for p in SOURCES)
    key = hashlib.sha256(b"\0".join([src, cc.encode(), " ".join(flags).encode(),
                                     platform.machine().encode(), sys.platform.encode()])).hexdigest()[:16]
    target = writable_folder(cache_dir()) / f"hist_kernels-{key}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        res = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed: {res.stderr.strip()[-300:]}")
        os.replace(tmp, target)
        log.info("built the native histogram kernels in %.1f s (%s)", time.perf_counter() - t0, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
_F32, _F64 = ctypes.c_float, ctypes.c_double
#: the C signatures (hist_kernels.c), pointers as void*
_SIGNATURES = {
    "amct_stream_update_mt": (None, [_I32, _I32, _P, _P, _F32, _F32, _I64, _I64, _P, _I64, _F32, _F32, _P,
                                     _I64, _P, _P]),
    "amct_hfmg_hist_mt": (None, [_I32, _I32, _P, _P, _F32, _F32, _F32, _I64, _P, _I64, _P, _P, _P]),
    "amct_set_isa": (_I32, [_I32]),
    "amct_chunk_bounds": (None, [_I32, _P, _I64, _I64, _I64, _P, _P, _P, _P]),
    "amct_add_packed": (None, [_I32, _P, _I64, _I64, _I64, _P, _P, _I32]),
    "amct_insert_extremes": (_I32, [_P, _I64, _P, _I64, _I32]),
    "amct_stream_step": (_I32, [_I32, _I32, _P, _P, _F32, _F32, _I64, _I64, _P, _I64, _F32, _F32, _P, _I64, _P, _P,
                                _F32, _F32, _I64, _I64, _I64, _I64, _I64, _P, _P, _I64, _P, _P, _I32, _P]),
    "amct_frame_for": (None, [_F64, _F64, _I64, _I64, _I64, _I64, _P]),
    "amct_hfmg_losses": (None, [_P, _P, _I64, _P, _P, _I64, _F64, _F64, _P, _I32, _I32]),
    "amct_ifmr_hist_losses": (_I32, [_P, _P, _I64, _F64, _F64, _P, _P, _P, _I64, _P]),
    "amct_hfmg_walk": (_I64, [_P, _I64, _P, _P]),
    "amct_hfmg_redistribute": (None, [_P, _I64, _F64, _F64, _F64, _F64, _P]),
}


def load_library(cc: str) -> ctypes.CDLL:
    """Build (or find) the kernels with ``cc``, load them and declare their signatures."""
    lib = ctypes.CDLL(str(build(cc)))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
