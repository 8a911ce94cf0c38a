"""Atomic file replacement: a crash or a full disk never leaves a half-written file.

The content goes to a temporary file in the destination's own folder (the final rename stays on
one filesystem), is flushed to disk and replaces the destination with ``os.replace``; the file
gets the permissions a plain ``open(path, "w")`` would give, not ``mkstemp``'s 0600, so that a
shared group can read the results. ``atomic_write_bytes``/``atomic_write_text`` take content in
memory, ``atomic_file`` content written piece by piece, ``staged_files`` several files published
together once all are checked, and ``temp_beside``/``remove_quietly`` handle the temporary file."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any, Callable, Protocol, TypeVar

from amct_torch.files.output_errors import write_error
from amct_torch.files.termination import clean_exit_on_signals


class _Writable(Protocol):
    def write(self, data: Any) -> Any: ...

    def flush(self) -> None: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


F = TypeVar("F", bound=_Writable)


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


def temp_beside(path: str, suffix: str = ".tmp") -> tuple[int, str]:
    """A new private file in ``path``'s own folder, named ``.<name>.<random><suffix>`` (hidden,
    and recognisably ``path``'s): (its open descriptor, its path). Beside, so that renaming it
    over ``path`` stays on one filesystem."""
    path = os.fspath(path)
    return tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=suffix,
                            dir=os.path.dirname(os.path.abspath(path)))


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it is there (cleaning up after an error: a second error would hide
    the first)."""
    with suppress(OSError):
        os.unlink(path)


def _plain(fd: int) -> IO[bytes]:
    return os.fdopen(fd, "wb")


def _close(f: Any) -> None:
    f.close()


@contextmanager
def atomic_file(path: str, opener: Callable[[int], F] = _plain,  # type: ignore[assignment]
                discard: Callable[[F], None] = _close) -> Iterator[F]:
    """A binary file for ``path``, written piece by piece and put in place atomically: the
    pieces go to ``temp_beside(path)`` (opened by ``opener(fd)``, e.g. ``direct_io.DirectFile``;
    default an ordinary file), which on a clean exit is flushed, synced, closed and renamed
    over ``path``; on any error, a SIGTERM included, it is closed with ``discard`` (a file that
    can drop its unwritten buffers does so) and removed, and ``path`` is left as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    with clean_exit_on_signals():  # a SIGTERM mid-write removes the temporary file too
        try:
            fd, tmp = temp_beside(path)
        except OSError as err:
            raise write_error(err, path) from None
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, file_mode())
            f = opener(fd)
        except BaseException:
            try:
                os.close(fd)
            finally:
                remove_quietly(tmp)
            raise
        try:
            yield f
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(tmp, path)
        except BaseException as err:
            try:
                discard(f)
            finally:
                remove_quietly(tmp)
            if isinstance(err, OSError) and (err.filename is None or err.filename == tmp):
                raise write_error(err, path) from None  # the user's file, never the temporary one
            raise
    fsync_dir(folder)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, ``\n`` line ends) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the old file stays intact on failure."""
    with atomic_file(path, _plain) as f:
        f.write(data)


@contextmanager
def staged_files() -> Iterator[list[tuple[str, str]]]:
    """Several files put in place together, none unless all are complete: the block appends a
    (temporary, final) pair for each temporary file it writes beside its final path (e.g. a
    model written and then checked); on a clean exit each is synced, given the mode of a new
    file and renamed to its final path, the folders then synced; on any error, a SIGTERM
    included, every temporary file is removed and no final path changes."""
    staged: list[tuple[str, str]] = []
    with clean_exit_on_signals():
        try:
            yield staged
            for tmp, _ in staged:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.chmod(tmp, file_mode())
            for tmp, path in staged:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in staged:
                remove_quietly(tmp)
            raise
        for folder in {os.path.dirname(os.path.abspath(p)) for _, p in staged}:
            fsync_dir(folder)
