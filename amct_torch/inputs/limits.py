"""What an input path may be, and the bounds on counts a user can ask for.

Why: reading a FIFO, a terminal or a socket blocks until another process writes to it (a data
file or a ``--checkpoint`` named after a FIFO hung the command forever), and a count such as
``--batch-num 1000000000000000`` or an archive of a hundred thousand members turns a small
input into unbounded work. Every reader of a user's path checks it here first, by ``stat``
(never by opening it), and every count is bounded by a documented limit (docs/workflow.md).
Torch-free: the command line checks its arguments with it before torch loads.
"""
from __future__ import annotations

import os
import stat
from typing import Optional

from amct_torch.errors import AmctError, DataError

#: largest --batch-num / batch_num (the config format's own field is 32-bit; a million batches
#: is days of calibration on any model)
MAX_BATCH_NUM = 1_000_000
#: most arrays in one .npz file (calibration data are one array of samples, or a few inputs)
MAX_NPZ_MEMBERS = 10_000

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def check_regular_file(path: str, what: str = "file", error: type[AmctError] = DataError) -> None:
    """Refuse (``error`` naming ``path``) anything but a regular file (links followed) before
    it is opened: reading a FIFO, device or socket could block forever or never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{what} not found", file=path) from None
    except OSError as err:
        raise error(f"cannot read the {what}: {err.strerror or err}", file=path) from None
    if not stat.S_ISREG(mode):
        why = "" if stat.S_ISDIR(mode) else "; it is not read (reading it could block forever)"
        raise error(f"the {what} is {file_kind(mode)}, not a regular file{why}", file=path)


def check_checkpoint_path(path: str, error: type[AmctError] = DataError) -> None:
    """A ``--checkpoint`` path, before calibration starts: an existing one must be a regular
    file, a new one needs an existing folder to be written in (``error`` naming it)."""
    path = os.fspath(path)
    if os.path.exists(path):  # (a dangling link is a new file: saving replaces the link)
        check_regular_file(path, "calibration checkpoint", error)
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise error(f"the folder of the calibration checkpoint does not exist ({folder}); "
                    "create it or give another --checkpoint", file=path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"cannot write the calibration checkpoint in {folder} (permission denied)",
                    file=path)


def check_batch_num(value: object, file: Optional[str] = None,
                    error: type[AmctError] = DataError) -> int:
    """``value`` as a batch count in [1, MAX_BATCH_NUM] (``error`` otherwise, naming ``file``:
    the calibration data, which no such count could be drawn from)."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    else:
        try:
            if isinstance(value, bool) or int(value) != value:  # type: ignore[call-overload]
                raise ValueError
            count = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise error(f"batch_num must be an integer, got {value!r}", file=file) from None
    if count < 1:
        raise error(f"batch_num must be >= 1, got {count}", file=file)
    if count > MAX_BATCH_NUM:
        raise error(f"batch_num (--batch-num) {count} asks for more calibration batches than the "
                    f"data can give; at most {MAX_BATCH_NUM} are allowed", file=file)
    return count
