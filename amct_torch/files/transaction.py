"""Outputs as a transaction: every file one command writes appears together, complete, or not at
all, and no input is ever overwritten.

Why: a job can be killed at any moment (SIGKILL on pre-emption) and a typo in ``--output`` can
name an input. All outputs go into one staging folder inside the destination folder (same
filesystem: every final step is a ``rename``), are fsynced, and a manifest written atomically
is the commit point; the renames then run, and a kill after the commit is finished by the
next command on the same prefix. SIGTERM and SIGHUP end an open transaction like Ctrl-C.
The protocol, the leftovers a kill can cause and the signals: docs/workflow.md."""
from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from typing import Optional

from amct_torch.errors import AmctError, excerpt
from amct_torch.files.atomic import atomic_write_text, file_mode, fsync_dir
from amct_torch.files.output_errors import REASONS, STAGING_SUFFIX, user_path, write_error
from amct_torch.files.termination import SignalGuard, Terminated, signals_held

__all__ = ["OutputTransaction", "Published", "Terminated", "check_outputs", "make_folder", "open_outputs", "recover",
           "same_file", "staging_folder", "user_path", "write_error", "check_output_name"]

log = logging.getLogger("amct_torch")

MANIFEST = "COMMITTED.json"
_LOCK = "lock"
#: the staging folder's subfolder holding a link to each earlier file a commit replaces
ASIDE = "replaced"
def _replaceable(path: str, folder_stat: os.stat_result) -> None:
    """Raise ``PermissionError`` when this process may not replace ``path``: another user's
    file in a sticky folder (``/tmp``) that is not ours either (root may)."""
    if os.geteuid() == 0 or not folder_stat.st_mode & stat.S_ISVTX:
        return
    own = os.lstat(path).st_uid
    if os.geteuid() not in (own, folder_stat.st_uid):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)


def _keep_old(paths: Sequence[str], aside: str) -> list[str]:
    """Before the commit point, proof that each earlier output can be replaced and a way back:
    a hard link of each into ``aside`` (a copy where the filesystem has no hard links); an
    immutable or append-only file refuses the link, another user's file in a sticky folder is
    refused by its owner. Nothing in the output folder changes here. ``AmctError`` naming the
    first that cannot be replaced."""
    os.mkdir(aside, 0o700)
    kept = []
    for p in paths:
        try:
            _replaceable(p, os.stat(os.path.dirname(p)))
            try:
                os.link(p, os.path.join(aside, os.path.basename(p)), follow_symlinks=False)
            except OSError as err:
                if err.errno in (errno.EPERM, errno.EACCES, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
                    raise
                shutil.copy2(p, os.path.join(aside, os.path.basename(p)), follow_symlinks=False)
        except OSError as err:
            raise write_error(err, p, kept=True) from None
        kept.append(p)
    return kept


def _restore(placed: Sequence[str], aside: str) -> None:
    """Put the earlier files back over the new ones placed (an error here is raised: the old
    set must be whole, or the user told where it is)."""
    for p in placed:
        old = os.path.join(aside, os.path.basename(p))
        try:
            if os.path.lexists(old):
                os.replace(old, p)
            else:  # there was no earlier file of this name
                os.unlink(p)
        except OSError as err:
            raise AmctError(f"could not put the earlier output back ({err.strerror or err}); it "
                            f"is in {aside}", file=p) from None


class Published(list):
    """What ``commit`` returns: the final paths published (a list, as before), and
    ``removed``: the earlier run's files of the prefix that this commit removed."""

    def __init__(self, paths: Iterable[str], removed: Iterable[str] = ()) -> None:
        super().__init__(paths)
        self.removed = list(removed)


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


#: the longest file name and path most filesystems take (Linux's NAME_MAX and PATH_MAX)
NAME_MAX = 255
PATH_MAX = 4096
#: what the private names add to an output's: ``.{name}.{8 random}.tmp`` and the staging
#: folder ``.{prefix}.amct-partial`` above it
_PRIVATE_EXTRA = len(".") + len(".12345678.tmp")


def check_output_name(path: object, what: str = "output", suffixes: Sequence[str] = ("",)) -> str:
    """``path`` (a str or ``os.PathLike``) as a string, refused (``AmctError`` naming it) before
    any work when it cannot name the outputs: not a path, empty, a folder (``.``, ``..``,
    ``out/``, ``out/.``, an existing folder), or so long that a file written under it (each of
    ``suffixes`` appended, with the private names of the write) passes the filesystem's limits."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise AmctError(f"{what} must be a path (str or os.PathLike), got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise AmctError(f"{what} must be a path (str or os.PathLike), got bytes")
    base = os.path.basename(text)
    if not text or base in ("", ".", ".."):
        raise AmctError(f"{what} must name a file or a prefix such as out/model, not a folder",
                        file=text or None)
    if os.path.isdir(text):
        raise AmctError(f"{what} is an existing folder; give a file path or a prefix inside it "
                        f"such as {os.path.join(text, 'model')}", file=text)
    longest = max(len(os.fsencode(base + s)) for s in suffixes)
    if longest + _PRIVATE_EXTRA > NAME_MAX:
        raise AmctError(f"{what}'s file name is too long: {longest} bytes with its suffix, at "
                        f"most {NAME_MAX - _PRIVATE_EXTRA}", file=excerpt(text, 120))
    full = len(os.fsencode(os.path.abspath(text))) + len(STAGING_SUFFIX) + 2 * _PRIVATE_EXTRA + longest
    if full >= PATH_MAX:
        raise AmctError(f"{what} is too long a path ({full} bytes with the private names of the "
                        f"write, at most {PATH_MAX - 1})", file=excerpt(text, 120))
    return text


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
        for made in created:  # deepest first: nothing of this attempt stays
            with contextlib.suppress(OSError):
                os.rmdir(made)
        why = REASONS.get(err.errno or 0) or err.strerror or str(err)
        raise AmctError(f"cannot create the output folder: {why}", file=excerpt(folder, 200)) from None
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


def _read_manifest(path: str) -> Optional[dict]:
    """The manifest's ``moves`` and ``removes`` (lists of plain file names), or None when the
    file is unreadable or not in the format ``commit`` writes."""
    if os.path.islink(path) or not os.path.isfile(path):  # a FIFO would block the read
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):  # ValueError: bad JSON, bad UTF-8
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("moves"), list):
        return None
    out = {"moves": doc["moves"], "removes": doc.get("removes", [])}
    for names in out.values():
        if not isinstance(names, list) or not all(
                isinstance(n, str) and n and n == os.path.basename(n) and n not in (".", "..")
                for n in names):
            return None
    return out


def _prefix_name(staging: str) -> Optional[str]:
    """The output prefix's file name of a staging folder (``.m.amct-partial`` → ``m``)."""
    base = os.path.basename(staging)
    if base.startswith(".") and base.endswith(STAGING_SUFFIX) and len(base) > len(STAGING_SUFFIX) + 1:
        return base[1:-len(STAGING_SUFFIX)]
    return None


def _unlink_stale(paths: Iterable[str]) -> list[str]:
    """Remove each path that is a file or a link (never a folder); the ones removed."""
    done = []
    for p in paths:
        try:
            if os.path.lexists(p) and not (os.path.isdir(p) and not os.path.islink(p)):
                os.unlink(p)
                done.append(p)
        except FileNotFoundError:
            pass
    return done


def recover(staging: str, inputs: Iterable[Optional[str]] = (), known_suffixes: Sequence[str] = ()) -> list[str]:
    """Finish or discard what a killed run left in ``staging``: with a manifest (the run had
    committed) the listed files still there are renamed into place and the stale ones it lists
    removed; then the folder is removed. Returns the final paths completed. Refuses
    (``AmctError``) a staging folder that a live run holds. A damaged manifest is discarded
    with the folder (the run is taken as never committed); a listed name is never moved onto
    or removed from one of ``inputs``, and only the prefix's known output names (the prefix with
    one of ``known_suffixes``) are removed."""
    if not os.path.lexists(staging):
        return []
    if not os.path.isdir(staging) or os.path.islink(staging):
        raise AmctError("a file is in the way of the staging folder; remove it", file=staging)
    lock = os.path.join(staging, _LOCK)
    if os.path.lexists(lock) and (os.path.islink(lock) or not os.path.isfile(lock)):
        # a live run's lock is a regular file it made: anything else is debris of no run
        log.warning("%s: discarding the staging folder of an earlier run whose lock is not a "
                    "file", staging)
        return _discard(staging)
    try:
        fd = _try_lock(lock)
    except OSError as err:
        raise AmctError(f"cannot open the lock of an earlier run's staging folder ({err.strerror or err}); "
                        "delete the folder", file=staging) from None
    if fd is None:
        raise AmctError("another amct-torch run is writing outputs with this prefix right now",
                        file=staging)
    ins = [os.fspath(p) for p in inputs if isinstance(p, (str, os.PathLike))]
    done: list[str] = []
    try:
        manifest = os.path.join(staging, MANIFEST)
        if os.path.lexists(manifest):
            doc = _read_manifest(manifest)
            if doc is None:
                log.warning("%s: discarding the staging folder of an earlier run whose manifest is "
                            "damaged (its outputs were never complete)", staging)
            else:
                done = _finish(staging, doc, ins, known_suffixes)
        _discard(staging)
    finally:
        os.close(fd)
    return done


def _discard(staging: str) -> list[str]:
    """Remove a dead run's staging folder; ``AmctError`` naming it when it cannot be removed
    (a later run could never start on this prefix otherwise)."""
    shutil.rmtree(staging, ignore_errors=True)
    if os.path.lexists(staging):
        raise AmctError("cannot remove the staging folder of an earlier run (permissions?); "
                        "delete it", file=staging)
    return []


def _finish(staging: str, doc: dict, inputs: list[str], known_suffixes: Sequence[str]) -> list[str]:
    """The renames and removals of a committed manifest that a kill interrupted."""
    folder = os.path.dirname(staging)
    done = []
    for name in doc["moves"]:
        src, dst = os.path.join(staging, name), os.path.join(folder, name)
        if os.path.isfile(src) and not os.path.islink(src) and \
                not any(same_file(dst, i) for i in inputs):
            os.replace(src, dst)
            done.append(dst)
    prefix = _prefix_name(staging)
    known = {prefix + s for s in known_suffixes} if prefix else set()
    stale = [os.path.join(folder, n) for n in doc["removes"]
             if n in known and n not in doc["moves"]]
    _unlink_stale(p for p in stale if not any(same_file(p, i) for i in inputs))
    fsync_dir(folder)
    return done


#: transactions of this process begun and not yet closed (strong references: one a signal cut
#: short must still be found by ``abort_open``)
_OPEN: set = set()


def abort_open() -> None:
    """Abort every transaction of this process still open: a termination signal can end a
    command between ``begin()`` and the caller's own ``try``/``finally``. Run by the CLI on
    ``Terminated`` and at interpreter exit."""
    for tx in list(_OPEN):
        with contextlib.suppress(Exception):  # best effort at exit; the next run recovers the rest
            tx.abort()


atexit.register(abort_open)


class OutputTransaction:
    """The files one command writes under one folder, committed together.

    ``finals``: every path the command may write (all in one folder); ``inputs``: the user's
    input files, which no output may name; ``name``: the output prefix's file name (names the
    staging folder ``.{name}.amct-partial``); ``owns_prefix``: the output prefix when this
    command writes the prefix's whole set (the calibrate job): the commit then also removes the
    prefix's known output names (the prefix with one of ``known_suffixes``: every file a run
    under it may write) this run did not write (``Published.removed``); a killed commit's
    recovery removes only such names too. ``begin()``
    checks, creates the folder, recovers a killed run's leftovers and makes the staging folder;
    write each output at ``staged(final)``; ``commit(finals_written)`` publishes them;
    ``abort()`` (or leaving the ``with`` block with an error) discards them."""

    def __init__(self, finals: Sequence[str], inputs: Iterable[Optional[str]] = (),
                 name: Optional[str] = None, owns_prefix: Optional[str] = None,
                 known_suffixes: Sequence[str] = ()) -> None:
        self.finals = [os.path.abspath(os.fspath(p)) for p in finals]
        if not self.finals:
            raise ValueError("an output transaction needs at least one output")
        self.folder = os.path.dirname(self.finals[0])
        if any(os.path.dirname(p) != self.folder for p in self.finals):
            raise ValueError("all outputs of one transaction must be in one folder")
        self.inputs = [p for p in inputs if isinstance(p, (str, os.PathLike))]
        self.name = name
        self.known_suffixes = tuple(known_suffixes)
        self.owns_prefix = None if owns_prefix is None else os.path.abspath(os.fspath(owns_prefix))
        if self.owns_prefix is not None and os.path.dirname(self.owns_prefix) != self.folder:
            raise ValueError("the owned prefix must be in the outputs' folder")
        self.staging: Optional[str] = None
        self._lock: Optional[int] = None
        self._created: list[str] = []
        self._signals = SignalGuard()
        self._committed = False  # past the commit point (the manifest is written)

    def begin(self, name: Optional[str] = None) -> OutputTransaction:
        """Check the outputs, create the folder, clean a killed run's staging folder and make
        a fresh one named after ``name`` (default: the first output's file name)."""
        check_outputs(self.finals, self.inputs)
        self._check_replaceable()
        self._created = make_folder(self.folder)
        name = name or self.name or os.path.basename(self.finals[0])
        staging = staging_folder(os.path.join(self.folder, name))
        recover(staging, self.inputs, self.known_suffixes)
        self._signals.install()  # from here a SIGTERM cleans up like Ctrl-C
        try:
            with signals_held():  # the folder made and recorded as ours, or neither
                try:
                    os.mkdir(staging, 0o700)
                except FileExistsError:
                    raise AmctError("another amct-torch run is writing outputs with this prefix "
                                    "right now", file=staging) from None
                except OSError as err:
                    raise AmctError(f"cannot write in the output folder: {err.strerror or err}",
                                    file=self.folder) from None
                self.staging = staging
                _OPEN.add(self)
            try:
                self._lock = _try_lock(os.path.join(staging, _LOCK))
            except OSError as err:  # no inode left, a quota: the user's folder, not our lock
                raise write_error(err, self.folder) from None
        except BaseException:  # Terminated included: nothing of this run stays
            self.abort()
            raise
        return self

    def _check_replaceable(self) -> None:
        """Refuse, before any work, an earlier output this process may not replace or remove
        (another user's file in a sticky folder: ``_replaceable``); the commit proves it again."""
        owned = [self.owns_prefix + s for s in self.known_suffixes] if self.owns_prefix is not None else []
        for p in self.finals + owned:
            if not os.path.lexists(p) or (os.path.isdir(p) and not os.path.islink(p)) \
                    or any(same_file(p, i) for i in self.inputs):
                continue
            try:
                _replaceable(p, os.stat(os.path.dirname(p)))
            except OSError as err:
                raise write_error(err, p, kept=True) from None

    def staged(self, final: str) -> str:
        """Where to write the output that will be published as ``final``."""
        assert self.staging is not None, "begin() first"
        return os.path.join(self.staging, os.path.basename(os.fspath(final)))

    def staged_prefix(self, prefix: str) -> str:
        """The staged form of an output prefix (``out/model`` → ``out/.model.amct-partial/model``)."""
        return self.staged(prefix)

    def final_of(self, path: str) -> str:
        """The final path of a staged or temporary path (other paths unchanged): for error
        messages, which name the user's files only."""
        return user_path(path)

    def stale(self, publishing: Sequence[str]) -> list[str]:
        """The earlier run's files that a commit publishing ``publishing`` removes: the owned
        prefix's known output names that exist (as files or links), are not published now, and
        are not an input of this command."""
        if self.owns_prefix is None:
            return []
        keep = {os.path.abspath(p) for p in publishing}
        out = []
        for p in (self.owns_prefix + s for s in self.known_suffixes):
            p = os.path.abspath(p)
            if p in keep or not os.path.lexists(p) or (os.path.isdir(p) and not os.path.islink(p)):
                continue
            if any(same_file(p, i) for i in self.inputs):
                continue
            out.append(p)
        return out

    def commit(self, finals: Optional[Sequence[str]] = None) -> Published:
        """Publish the staged files of ``finals`` (default: every final that was staged):
        fsync each, set the umask's permissions, keep a link to each earlier file of these names
        (and the owned prefix's stale ones) -- proving each one can be replaced -- write the
        manifest (the commit point), rename the new files into place, remove the stale ones and
        the staging folder. A rename that fails puts the earlier files back (``AmctError``
        naming the output and saying the previous outputs were kept). Returns the final paths,
        with ``.removed`` the stale files removed."""
        assert self.staging is not None, "begin() first"
        wanted = [os.path.abspath(os.fspath(p)) for p in (finals if finals is not None else self.finals)]
        moves = [p for p in wanted if os.path.isfile(self.staged(p))]
        stale = self.stale(moves)
        mode = file_mode()
        try:
            for p in moves:
                fd = os.open(self.staged(p), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.chmod(self.staged(p), mode)
            fsync_dir(self.staging)
        except OSError as err:
            raise write_error(err, self.final_of(err.filename or self.folder)) from None
        aside = os.path.join(self.staging, ASIDE)
        _keep_old([p for p in moves + stale if os.path.lexists(p)], aside)
        with signals_held():  # from the commit point on, a signal waits for the whole set
            try:
                atomic_write_text(os.path.join(self.staging, MANIFEST),
                                  json.dumps({"moves": [os.path.basename(p) for p in moves],
                                              "removes": [os.path.basename(p) for p in stale]}))
            except OSError as err:
                raise write_error(err, self.folder, kept=True) from None
            self._committed = True
            placed: list[str] = []
            try:
                for p in moves:
                    os.replace(self.staged(p), p)
                    placed.append(p)
                removed = _unlink_stale(stale)
            except OSError as err:  # the earlier files back over the new ones: the old set,
                # stale files already removed included (their links are in ``aside`` too)
                gone = [p for p in stale if not os.path.lexists(p)
                        and os.path.lexists(os.path.join(aside, os.path.basename(p)))]
                _restore(placed + gone, aside)
                os.unlink(os.path.join(self.staging, MANIFEST))
                self._committed = False
                raise write_error(err, err.filename if isinstance(err.filename, str) else self.folder,
                                  kept=True) from None
            fsync_dir(self.folder)
            self._created = []
            self._close()
        return Published(moves, removed)

    def abort(self) -> None:
        """Discard everything staged (the previous outputs stay as they were); past the
        commit point (a kill cut the commit short) finish the set instead. An error doing so
        is raised (``AmctError`` naming the staging folder, which keeps what the next run on
        this prefix needs)."""
        if self.staging is not None and self._committed:
            staging, self.staging = self.staging, None
            self._close()  # our lock goes first: recover takes it
            try:
                recover(staging, self.inputs, self.known_suffixes)
            except OSError as err:
                raise AmctError(f"the outputs were committed but could not all be put in place "
                                f"({err.strerror or err}); the next run on this prefix finishes "
                                "them", file=staging) from None
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
        _OPEN.discard(self)
        self._signals.restore()

    def __enter__(self) -> OutputTransaction:
        return self if self.staging is not None else self.begin()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.abort()
            return
        try:
            self.abort()
        except AmctError as err:  # the error in flight stays the one raised
            log.error("%s", err)
        if isinstance(exc, OSError) and not isinstance(exc, AmctError):
            # a full disk, a folder made read-only: the user's output, never our private names
            prefix = os.path.join(self.folder, self.name) if self.name else self.folder
            raise write_error(exc, self.final_of(exc.filename) if isinstance(exc.filename, str)
                              else prefix) from None


def open_outputs(finals: Sequence[str], inputs: Iterable[Optional[str]], *, name: str,
                 owns_prefix: Optional[str] = None, known_suffixes: Sequence[str] = (),
                 writer: bool = True) -> Optional[OutputTransaction]:
    """A command's outputs, refused before any work when one is an input, a folder or named
    twice (``check_outputs``); when this process writes them (``writer``), their transaction
    made and begun (staging folder ``.{name}.amct-partial``), else None (a distributed job's
    other ranks write nothing)."""
    if not writer:
        check_outputs(finals, inputs)
        return None
    return OutputTransaction(finals, inputs, owns_prefix=owns_prefix, known_suffixes=known_suffixes).begin(name)
