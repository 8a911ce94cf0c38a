"""Atomic file replacement: a crash or a full disk never leaves a half-written file.

The text goes to a temporary file in the destination's own folder (so the final rename stays
on one filesystem), is flushed to disk, and then replaces the destination with ``os.replace``,
which is atomic on POSIX and Windows.
"""
from __future__ import annotations

import os
import tempfile


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, ``\n`` line ends) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the old file stays intact on failure."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=folder)
    try:
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
