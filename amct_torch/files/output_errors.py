"""The one-line error of a failed write, in the user's terms: the output path they gave (never
a private temporary file ``.name.xxxxxxxx.tmp`` or the staging folder ``.prefix.amct-partial``)
and what went wrong in plain words (no space left, permission denied, read-only file system).

Why its own module: the atomic writer, the output transaction and the command line all turn
an ``OSError`` into this one line, and none of them may depend on the others for it.
"""
from __future__ import annotations

import errno
import os
import re
from typing import Optional

from amct_torch.errors import AmctError, OutputError

#: the staging folder beside the outputs is named ``.{prefix name}`` + this
STAGING_SUFFIX = ".amct-partial"
#: a private temporary file beside its final file: ``.{name}.{8 random}.tmp`` (atomic.temp_beside)
_TEMP_NAME = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}\.(?:tmp|view)$")
#: errno → the words of the one-line error (the rest: the system's own strerror)
REASONS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted (an immutable or another user's file?)",
        errno.ENAMETOOLONG: "file name too long", errno.ENOENT: "its folder does not exist (any more)"}


def user_path(path: str) -> str:
    """The user's output path that a private path stands for: a file in a staging folder
    (``out/.m.amct-partial/m_record.txt`` → ``out/m_record.txt``) or a temporary file beside
    its final file (``out/.m_record.txt.x1y2z3w4.tmp`` → ``out/m_record.txt``)."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    if name.startswith(".") and name.endswith(STAGING_SUFFIX) and len(name) > len(STAGING_SUFFIX) + 1:
        return os.path.join(folder, name[1:-len(STAGING_SUFFIX)])  # the staging folder itself
    m = _TEMP_NAME.match(name)
    if m:
        name = m.group(1)
    if os.path.basename(folder).endswith(STAGING_SUFFIX) and os.path.basename(folder).startswith("."):
        folder = os.path.dirname(folder)
    elif m and os.path.basename(os.path.dirname(folder)).endswith(STAGING_SUFFIX):
        folder = os.path.dirname(os.path.dirname(folder))
    return os.path.join(folder, name) if folder else name


def write_error(err: OSError, where: Optional[str], kept: bool = False) -> AmctError:
    """The one-line error of a failed write: the user's output path (never a private temporary
    or staging name) and what went wrong in plain words; ``kept``: say that the previous
    outputs were kept."""
    why = REASONS.get(err.errno or 0) or err.strerror or str(err)
    tail = "; the previous outputs were kept" if kept else ""
    out = OutputError(f"cannot write the output: {why}{tail}", file=user_path(where) if where else None)
    out.errno, out.strerror = err.errno, err.strerror
    return out
