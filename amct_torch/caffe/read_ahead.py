"""Reading the Caffe model on a helper thread while the command is still importing torch.

Why: ``amct-torch calibrate`` spends 1.5-2 s importing torch, and reading a large caffemodel
needs no torch (``netio.read_net``: numpy and protobuf, which release the interpreter lock in
their large reads), so the read finishes inside the import's time. A read is used only if its
files are still the same when the job asks (path, device, inode, size and modification time,
before and after); a failed read is dropped and the job reads the files itself, reporting any
problem exactly as without the read-ahead."""
from __future__ import annotations

import os
import stat
import threading
from typing import TYPE_CHECKING, Any, Optional

from amct_torch.runtime.helper_thread import HelperThread

if TYPE_CHECKING:
    from amct_torch.caffe.netio import ParsedNet

__all__ = ["start", "take"]

_lock = threading.Lock()
_pending: dict[tuple, HelperThread] = {}


def _read(model_file: Any, weights_file: Any) -> ParsedNet:
    from amct_torch.caffe.netio import read_net
    return read_net(model_file, weights_file)


def _key(model_file: Any, weights_file: Any) -> Optional[tuple]:
    """The files' identity, or None when one cannot be examined or is not a regular file
    (a FIFO would block the thread; the job's read says why it refuses it)."""
    parts: list[Any] = []
    for path in (model_file, weights_file):
        if path is None:
            parts.append(None)
            continue
        try:
            st = os.stat(path)
        except (OSError, ValueError, TypeError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        parts.append((os.path.abspath(os.fspath(path)), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(parts)


def start(model_file: Any, weights_file: Any) -> None:
    """Begin reading ``model_file`` and ``weights_file`` (paths, the second may be None) on a
    daemon thread (nothing when either cannot be examined now). One read ahead at a time: an
    earlier one nobody took (its job stopped before loading) is dropped."""
    key = _key(model_file, weights_file)
    if key is None:
        return
    reader = HelperThread(lambda: _read(model_file, weights_file), "amct-read-ahead")
    with _lock:
        _pending.clear()
        _pending[key] = reader


def take(model_file: Any, weights_file: Any) -> Optional[ParsedNet]:
    """The net read ahead for these files (waiting for the thread to finish), once; None when
    none was started, the files have changed since, or the read failed (the caller's own read
    then reports why)."""
    key = _key(model_file, weights_file)
    if key is None:
        return None
    with _lock:
        reader = _pending.pop(key, None)
    if reader is None:
        return None
    reader.wait()
    parsed, reader.result = reader.result, None
    if reader.error is not None or parsed is None or _key(model_file, weights_file) != key:
        return None  # failed, or the files were replaced during the read
    return parsed
