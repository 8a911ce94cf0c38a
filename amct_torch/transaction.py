"""Outputs as a transaction: every file one command writes appears together, complete, or not
at all, and no input is ever overwritten.

Why: a container job is killed with SIGKILL when pre-empted, a typo in ``--output`` can name an
input, and a temporary folder on another filesystem turns a rename into a copy that a kill can
tear. So all outputs of one command are written into one staging folder *inside the
destination folder* (same filesystem: every final step is a ``rename``), each file is fsynced,
and only when every one is complete a small manifest is written (atomically, fsynced: the
commit point) and the files are renamed into place, then the staging folder is removed.

A kill before the commit point leaves the previous outputs untouched (the staging folder is
garbage); a kill after it leaves the new set complete in the staging folder with its
manifest, and the next command on the same output prefix (``OutputTransaction.begin`` or
``recover``) finishes the renames before doing anything else. The staging folder is named
``.{prefix name}.amct-partial`` beside the outputs, is locked (``flock``) while its run is
alive, and is the only leftover a kill can cause.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Iterable, Optional, Sequence

from amct_torch.atomic import atomic_write_text, file_mode, fsync_dir
from amct_torch.errors import AmctError

STAGING_SUFFIX = ".amct-partial"
MANIFEST = "COMMITTED.json"
_LOCK = "lock"


def staging_folder(prefix: str) -> str:
    """The staging folder of outputs written under ``prefix`` (``out/model`` →
    ``out/.model.amct-partial``)."""
    prefix = os.path.abspath(os.fspath(prefix))
    return os.path.join(os.path.dirname(prefix), "." + os.path.basename(prefix) + STAGING_SUFFIX)


def same_file(a: str, b: str) -> bool:
    """True when paths ``a`` and ``b`` name the same file (existing: same inode; else the
    same resolved path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(outputs: Iterable[str], inputs: Iterable[Optional[str]] = ()) -> None:
    """Refuse, before any work, an output path that is an input file or an existing folder,
    or that appears twice (``AmctError`` naming the output path)."""
    outs = [os.fspath(p) for p in outputs]
    ins = [os.fspath(p) for p in inputs if isinstance(p, (str, os.PathLike))]
    for i, out in enumerate(outs):
        if os.path.isdir(out):
            raise AmctError("the output path is an existing folder; give a file path or a "
                            "prefix such as out/model", file=out)
        for src in ins:
            if same_file(out, src):
                raise AmctError(f"the output would overwrite the input {src}; choose another "
                                "--output", file=out)
        if any(same_file(out, o) for o in outs[:i]):
            raise AmctError("the same output path is given twice", file=out)


def make_folder(folder: str) -> list[str]:
    """Create an output folder (and its parents); ``AmctError`` naming it when impossible.
    Returns the folders created, deepest first (so that a failed run can remove them)."""
    created = []
    probe = os.path.abspath(folder)
    while probe and not os.path.lexists(probe):
        created.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise AmctError(f"cannot create the output folder: {err.strerror or err}",
                        file=folder) from None
    if not os.path.isdir(folder):
        raise AmctError("the output folder is not a folder", file=folder)
    return created


def _try_lock(path: str) -> Optional[int]:
    """An fd holding an exclusive flock on ``path``, or None when a live process holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): a staging folder is always taken as stale
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd


def recover(staging: str) -> list[str]:
    """Finish or discard what a killed run left in ``staging``: with a manifest (the run had
    committed) the listed files still there are renamed into place; then the folder is
    removed. Returns the final paths completed. Refuses (``AmctError``) a staging folder that a
    live run holds."""
    if not os.path.lexists(staging):
        return []
    if not os.path.isdir(staging) or os.path.islink(staging):
        raise AmctError("a file is in the way of the staging folder; remove it", file=staging)
    fd = _try_lock(os.path.join(staging, _LOCK))
    if fd is None:
        raise AmctError("another amct-torch run is writing outputs with this prefix right now",
                        file=staging)
    done: list[str] = []
    try:
        manifest = os.path.join(staging, MANIFEST)
        if os.path.isfile(manifest):
            with open(manifest, encoding="utf-8") as f:
                moves = json.load(f)["moves"]
            folder = os.path.dirname(staging)
            for name in moves:
                src = os.path.join(staging, os.path.basename(name))
                if os.path.isfile(src):
                    os.replace(src, os.path.join(folder, os.path.basename(name)))
                    done.append(os.path.join(folder, os.path.basename(name)))
            fsync_dir(folder)
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(fd)
    return done


class OutputTransaction:
    """The files one command writes under one folder, committed together.

    ``finals``: every path the command may write (all in one folder); ``inputs``: the user's
    input files, which no output may name; ``name``: the output prefix's file name (names the
    staging folder ``.{name}.amct-partial``). ``begin()`` checks, creates the folder, recovers a
    killed run's leftovers and makes the staging folder; write each output at
    ``staged(final)``; ``commit(finals_written)`` publishes them; ``abort()`` (or leaving the
    ``with`` block with an error) discards them."""

    def __init__(self, finals: Sequence[str], inputs: Iterable[Optional[str]] = (),
                 name: Optional[str] = None) -> None:
        self.finals = [os.path.abspath(os.fspath(p)) for p in finals]
        if not self.finals:
            raise ValueError("an output transaction needs at least one output")
        self.folder = os.path.dirname(self.finals[0])
        if any(os.path.dirname(p) != self.folder for p in self.finals):
            raise ValueError("all outputs of one transaction must be in one folder")
        self.inputs = [p for p in inputs if isinstance(p, (str, os.PathLike))]
        self.name = name
        self.staging: Optional[str] = None
        self._lock: Optional[int] = None
        self._created: list[str] = []

    def begin(self, name: Optional[str] = None) -> "OutputTransaction":
        """Check the outputs, create the folder, clean a killed run's staging folder and make
        a fresh one named after ``name`` (default: the first output's file name)."""
        check_outputs(self.finals, self.inputs)
        self._created = make_folder(self.folder)
        name = name or self.name or os.path.basename(self.finals[0])
        staging = staging_folder(os.path.join(self.folder, name))
        recover(staging)
        try:
            os.mkdir(staging, 0o700)
        except FileExistsError:
            raise AmctError("another amct-torch run is writing outputs with this prefix right "
                            "now", file=staging) from None
        except OSError as err:
            raise AmctError(f"cannot write in the output folder: {err.strerror or err}",
                            file=self.folder) from None
        self._lock = _try_lock(os.path.join(staging, _LOCK))
        self.staging = staging
        return self

    def staged(self, final: str) -> str:
        """Where to write the output that will be published as ``final``."""
        assert self.staging is not None, "begin() first"
        return os.path.join(self.staging, os.path.basename(os.fspath(final)))

    def staged_prefix(self, prefix: str) -> str:
        """The staged form of an output prefix (``out/model`` → ``out/.model.amct-partial/model``)."""
        return self.staged(prefix)

    def final_of(self, path: str) -> str:
        """The final path of a staged path (other paths unchanged): for error messages."""
        if self.staging and os.path.dirname(os.path.abspath(path)) == self.staging:
            return os.path.join(self.folder, os.path.basename(path))
        return path

    def commit(self, finals: Optional[Sequence[str]] = None) -> list[str]:
        """Publish the staged files of ``finals`` (default: every final that was staged):
        fsync each, set the umask's permissions, write the manifest (the commit point), rename
        all into place, remove the staging folder. Returns the final paths."""
        assert self.staging is not None, "begin() first"
        wanted = [os.path.abspath(os.fspath(p)) for p in (finals if finals is not None else self.finals)]
        moves = [p for p in wanted if os.path.isfile(self.staged(p))]
        mode = file_mode()
        for p in moves:
            fd = os.open(self.staged(p), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(self.staged(p), mode)
        fsync_dir(self.staging)
        atomic_write_text(os.path.join(self.staging, MANIFEST),
                          json.dumps({"moves": [os.path.basename(p) for p in moves]}))
        for p in moves:
            os.replace(self.staged(p), p)
        fsync_dir(self.folder)
        self._created = []
        self._close()
        return moves

    def abort(self) -> None:
        """Discard everything staged (the previous outputs stay as they were)."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        self._close()
        for folder in self._created:  # folders this run created stay only with its outputs
            try:
                os.rmdir(folder)
            except OSError:
                break
        self._created = []

    def _close(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> "OutputTransaction":
        return self if self.staging is not None else self.begin()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort()
