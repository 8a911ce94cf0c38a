"""Building, verifying and loading ``hist_kernels.c`` (used by ``native.py``).

Built once per machine with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``) into a
per-user cache (``$AMCT_TORCH_CACHE``, else ``$XDG_CACHE_HOME/amct_torch``, else
``~/.cache/amct_torch``), keyed by the sources, the compiler, the flags and the platform. Why so
careful: loading a library runs its code, and the cache is untrusted input. The cache folder
must be the user's and private, a library loads only if its SHA-256 matches the digest recorded
at build time, builds take a file lock, a library failing its self-check is deleted, and the
whole build has a time limit (``$AMCT_TORCH_BUILD_TIMEOUT``, 60 s) after which calibration uses
the torch formulas. The trust rules: README, "GPU and CPU"."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("amct_torch")

SOURCE = Path(__file__).with_name("hist_kernels.c")
#: every file of the one compilation unit (SOURCE includes the others): the cache key hashes them all
SOURCES = [SOURCE, SOURCE.with_name("hist_select.h"), SOURCE.with_name("hist_lanes.h")]
FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fPIC", "-shared"]
#: time limit of one build, in seconds (a normal build takes about one)
BUILD_TIMEOUT_S = 60.0
_warned: set = set()


def build_timeout() -> float:
    """The build's time limit: ``$AMCT_TORCH_BUILD_TIMEOUT`` seconds if it is a positive
    number, else ``BUILD_TIMEOUT_S``."""
    text = os.environ.get("AMCT_TORCH_BUILD_TIMEOUT", "").strip()
    try:
        value = float(text) if text else BUILD_TIMEOUT_S
    except ValueError:
        value = BUILD_TIMEOUT_S
    return value if 0 < value < float("inf") else BUILD_TIMEOUT_S


class BuildTimeout(RuntimeError):
    """The compiler (or another process's build) did not finish within the time limit."""


def _left(deadline: Optional[float], what: str) -> Optional[float]:
    """Seconds left before ``deadline`` (None: no limit); ``BuildTimeout`` when none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise BuildTimeout(f"{what} did not finish within the build time limit of "
                           f"{build_timeout():g} s (AMCT_TORCH_BUILD_TIMEOUT)")
    return left


def _run(cmd: list[str], deadline: Optional[float], what: str,
         cap: Optional[float] = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own, output captured, until ``deadline`` (and at most
    ``cap`` seconds); past it the whole process group is killed (a compiler wrapper script's
    own children too) and ``BuildTimeout`` is raised."""
    left = _left(deadline, what)
    limit = min(x for x in (left, cap) if x is not None) if (left, cap) != (None, None) else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        for stream in (proc.stdout, proc.stderr):  # a child that left the group may hold them
            if stream is not None:
                stream.close()
        proc.wait()
        if cap is not None and (left is None or cap < left):
            raise subprocess.TimeoutExpired(cmd, cap) from None
        raise BuildTimeout(f"{what} did not finish within the build time limit of "
                           f"{build_timeout():g} s (AMCT_TORCH_BUILD_TIMEOUT)") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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


def _uid() -> Optional[int]:
    return os.getuid() if hasattr(os, "getuid") else None


def is_private(path: Path, folder: bool) -> bool:
    """``path`` is ours alone: not a link, owned by this user, not writable by group or others
    (and a folder or a regular file as asked)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    uid = _uid()
    return kind_ok and (uid is None or st.st_uid == uid) and not st.st_mode & 0o022


def _make_private(folder: Path) -> Optional[Path]:
    """``folder`` created 0700 if missing; itself if it is private and writable, else None."""
    try:
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir(mode=0o700)
    except OSError:
        return None
    return folder if is_private(folder, folder=True) and os.access(folder, os.W_OK) else None


def writable_folder(folder: Path) -> Path:
    """``folder`` if it is (or can be created as) a private folder this process can write;
    else a private per-user temp folder, with one warning when ``folder`` exists but is not
    private (a shared or foreign cache: a library planted there must never run)."""
    got = _make_private(folder)
    if got is not None:
        return got
    if folder.exists() and str(folder) not in _warned:
        _warned.add(str(folder))
        log.warning("kernel cache %s is not private to this user (owner or permissions); "
                    "building the CPU kernels in a private folder instead", folder)
    tmp = Path(tempfile.gettempdir()) / f"amct_torch-{_uid() if _uid() is not None else 'user'}"
    got = _make_private(tmp)
    if got is not None:
        return got
    raise RuntimeError(f"no writable private folder for the build ({folder}, {tmp})")


def find_compiler() -> Optional[str]:
    """The C compiler command line to build with: ``$CC`` if set (None if its program does not
    resolve), else the first of cc, gcc, clang on the PATH."""
    cc = os.environ.get("CC")
    if cc:
        words = shlex.split(cc)
        exe = shutil.which(words[0]) if words else None
        if exe is None:
            return None
        return shlex.join([exe] + words[1:])
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def compiler_identity(cc: str, deadline: Optional[float] = None) -> str:
    """The compiler's own description of itself (``--version``'s first line), for the cache key:
    another compiler or version never reuses a library built by this one. A compiler that
    does not answer before ``deadline`` raises ``BuildTimeout``."""
    try:
        res = _run([*shlex.split(cc), "--version"], deadline, f"the C compiler {cc!r}", cap=30)
        first = (res.stdout or res.stderr).strip().splitlines()
        return first[0] if first else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def build(cc: str) -> Path:
    """Compile (or find in the cache) the kernels: with OpenMP if the compiler can, else
    without (the multi-threaded entry points then run their slices one after the other);
    both within one time limit (``build_timeout()``), past which it raises ``BuildTimeout``."""
    deadline = time.monotonic() + build_timeout()
    errors = []
    for flags in (FLAGS + ["-fopenmp"], FLAGS):
        try:
            return build_with(cc, flags, deadline)
        except BuildTimeout:
            raise
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            if str(exc) not in errors:
                errors.append(str(exc))
    raise RuntimeError("; ".join(errors))


def library_name(cc: str, flags: list[str], deadline: Optional[float] = None) -> str:
    """File name of the library for this compiler and flags (the cache key)."""
    src = b"\0".join(p.read_bytes() for p in SOURCES)
    key = hashlib.sha256(b"\0".join([src, cc.encode(), compiler_identity(cc, deadline).encode(),
                                     " ".join(flags).encode(), platform.machine().encode(),
                                     sys.platform.encode()])).hexdigest()[:16]
    return f"hist_kernels-{key}.so"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(target: Path) -> bool:
    """The cached library may be loaded: private regular file whose SHA-256 is the digest
    recorded (privately) when it was built."""
    record = target.with_suffix(".sha256")
    if not (is_private(target, folder=False) and is_private(record, folder=False)):
        return False
    try:
        return record.read_text().strip() == _digest(target)
    except OSError:
        return False


def discard(target: Path) -> None:
    """Delete a library (and its digest) that must not be used again (failed self-check)."""
    for p in (target, target.with_suffix(".sha256")):
        with contextlib.suppress(OSError):
            os.unlink(p)


def _lock_until(lock, deadline: Optional[float]) -> None:
    """Take the build lock, waiting for another process's build until ``deadline``."""
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
            return
        except BlockingIOError:
            _left(deadline, "another process's build of the CPU kernels")
            time.sleep(0.05)


def build_with(cc: str, flags: list[str], deadline: Optional[float] = None) -> Path:
    """Compile with ``flags`` into the cache (or find a verified build there); its path.
    The check and the build hold a lock on the folder, so concurrent processes build once.
    Past ``deadline`` (``time.monotonic()``; None: no limit) it raises ``BuildTimeout``."""
    folder = writable_folder(cache_dir())
    target = folder / library_name(cc, flags, deadline)
    with open(folder / ".build.lock", "a") as lock:
        _lock_until(lock, deadline)
        try:
            if verified(target):
                return target
            if os.path.lexists(target):
                log.warning("ignoring the cached CPU kernels %s (not private, or checksum mismatch); rebuilding",
                            target)
                discard(target)
            _compile(cc, flags, target, deadline)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _compile(cc: str, flags: list[str], target: Path, deadline: Optional[float] = None) -> None:
    """Compile into a temp file in the folder, record its digest, rename both into place."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        res = _run([*shlex.split(cc), *flags, "-o", tmp, str(SOURCE), "-lm"], deadline,
                   f"the C compiler {cc!r}", cap=None if deadline is not None else 300)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed: {res.stderr.strip()[-300:]}")
        os.chmod(tmp, 0o700)
        digest = _digest(Path(tmp))
        fd, tmp_digest = tempfile.mkstemp(suffix=".sha256", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp_digest, target.with_suffix(".sha256"))
        os.replace(tmp, target)
        log.info("built the native histogram kernels in %.1f s (%s)", time.perf_counter() - t0, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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


class KernelLibrary(ctypes.CDLL):
    """The loaded kernels, and the file they were loaded from (``_amct_path``, for ``discard``)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self._amct_path = path


def load_library(cc: str) -> KernelLibrary:
    """Build (or find) the kernels with ``cc``, check them again, load them and declare their
    signatures."""
    path = build(cc)
    if not verified(path):            # e.g. replaced between the build and here
        raise RuntimeError(f"the built library {path} failed its checksum or ownership check")
    lib = KernelLibrary(path)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
