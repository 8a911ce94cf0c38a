"""Atomic file replacement: a crash or a full disk never leaves a half-written file.

The text goes to a temporary file in the destination's own folder (so the final rename stays
on one filesystem), is flushed to disk, and then replaces the destination with ``os.replace``,
which is atomic on POSIX and Windows. The final file gets the permissions an ordinary
``open(path, "w")`` would give (0666 minus the umask), not ``mkstemp``'s private 0600, so
that a shared group or another container uid can read the results. A SIGTERM during the
write removes the temporary file (``amct_torch.termination``) before the process ends.
"""
from __future__ import annotations

import os
import tempfile

from amct_torch.termination import clean_exit_on_signals


def current_umask() -> int:
    """The process umask (read without changing it where /proc allows, else set and restore)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a newly created output file: what ``open(path, "w")`` would give."""
    return 0o666 & ~current_umask()


def fsync_dir(folder: str) -> None:
    """Make a rename inside ``folder`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, ``\n`` line ends) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the old file stays intact on failure."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    with clean_exit_on_signals():  # a SIGTERM mid-write removes the temporary file too
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=folder)
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, file_mode())
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    fsync_dir(folder)
