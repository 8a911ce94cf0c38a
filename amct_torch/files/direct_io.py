"""Writing a large output file around the page cache (``O_DIRECT``), with the device's write
overlapped with the caller's work.

Why: an ordinary ``write`` copies every byte into page-cache pages the kernel must find,
account for and flush; for the half-gigabyte models of a VGG-16 job that was most of the job's
system time. ``DirectFile`` copies what it is given into page-aligned buffers and writes whole
buffers at aligned offsets from a helper thread while the caller fills the next; the last buffer
is rounded up and the file cut to its true length. Where the filesystem refuses ``O_DIRECT`` the
same buffers go through ordinary writes; the bytes are the same either way. docs/performance.md."""
from __future__ import annotations

import errno
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

__all__ = ["DirectFile", "BUFFER_BYTES"]

#: bytes per buffer (two are used in turn): writes large enough for the device (1-8 MiB measured
#: alike), small beside a model (the buffers are part of the peak), a multiple of every block size
BUFFER_BYTES = 2 << 20
#: alignment of the memory, offsets and lengths of direct writes (covers 512 B and 4 KiB sectors)
ALIGN = 4096


def _direct_on(fd: int) -> bool:
    """Turn on ``O_DIRECT`` for ``fd``; False where the platform or filesystem refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)
    except OSError:
        return False
    return True


def _direct_off(fd: int) -> None:
    import fcntl
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))


class DirectFile:
    """A write-only binary file on the open descriptor ``fd`` (which it owns and closes),
    written from offset 0 in ``BUFFER_BYTES`` pieces, direct where the filesystem allows.

    ``write`` accepts any bytes-like object and returns its length; ``flush`` writes everything
    given so far (and cuts the file to that length); ``close`` flushes unless ``discard``
    (the caller is about to remove the file after an error) and closes ``fd``. An error of the
    helper thread (a full disk) is raised by the next ``write``, ``flush`` or ``close``."""

    def __init__(self, fd: int, threaded: bool = True) -> None:
        self.fd = fd
        self.direct = _direct_on(fd)
        self._bufs = [mmap.mmap(-1, BUFFER_BYTES) for _ in range(2)]
        self._views = [memoryview(b) for b in self._bufs]
        self._cur = 0
        self._fill = 0
        self._offset = 0  # file offset of the current buffer's first byte
        self._pool: Optional[ThreadPoolExecutor] = ThreadPoolExecutor(1, "amct-write") if threaded else None
        self._pending: Optional[Future] = None
        self.closed = False

    # -- the file interface the streaming writers use -----------------------------------------
    def fileno(self) -> int:
        return self.fd

    def write(self, data: Any) -> int:
        src = memoryview(data).cast("B")
        n = src.nbytes
        pos = 0
        while pos < n:
            take = min(BUFFER_BYTES - self._fill, n - pos)
            self._views[self._cur][self._fill:self._fill + take] = src[pos:pos + take]
            self._fill += take
            pos += take
            if self._fill == BUFFER_BYTES:
                self._send_full()
        return n

    def flush(self) -> None:
        """Everything given so far into the file, which is cut to exactly that length."""
        self._wait()
        size = self._offset + self._fill
        if self._fill:
            end = -(-self._fill // ALIGN) * ALIGN if self.direct else self._fill
            view = self._views[self._cur]
            view[self._fill:end] = bytes(end - self._fill)  # the padding, cut off below
            self._pwrite(view[:end], self._offset)
        os.ftruncate(self.fd, size)

    def close(self, discard: bool = False) -> None:
        if self.closed:
            return
        try:
            if discard:
                self._wait(raise_error=False)
            else:
                self.flush()
        finally:
            self.closed = True
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            # the buffers are unmapped with their last reference (an error's traceback may
            # still hold a view of one for a while)
            self._views, self._bufs = [], []
            os.close(self.fd)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(discard=kind is not None)

    # -- internals ----------------------------------------------------------------------------
    def _send_full(self) -> None:
        """Hand the full current buffer to the helper (after the previous one is written) and
        go on filling the other."""
        self._wait()
        view, offset = self._views[self._cur], self._offset
        if self._pool is not None:
            self._pending = self._pool.submit(self._pwrite, view, offset)
        else:
            self._pwrite(view, offset)
        self._offset += BUFFER_BYTES
        self._cur ^= 1
        self._fill = 0

    def _wait(self, raise_error: bool = True) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        err = pending.exception()
        if err is not None and raise_error:
            raise err

    def _pwrite(self, view: memoryview, offset: int) -> None:
        # one at a time: each write starts after the previous one ended (``_wait``)
        done = 0
        while done < view.nbytes:
            try:
                done += os.pwrite(self.fd, view[done:], offset + done)
            except OSError as err:
                # a filesystem that took the flag but not these writes: ordinary writes then
                if err.errno != errno.EINVAL or not self.direct:
                    raise
                _direct_off(self.fd)
                self.direct = False
