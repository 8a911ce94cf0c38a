"""Termination signals turned into a clean exit while outputs are being written.

Why: SIGTERM (``docker stop``, Kubernetes, torchrun stopping its workers) and SIGHUP (a closed
terminal) kill a Python process outright by default: no ``finally`` runs, so a staging folder
or a temporary file beside an output would stay behind. While ``SignalGuard`` is installed
they raise ``Terminated`` in the main thread instead, like Ctrl-C raises KeyboardInterrupt,
so that the cleanup runs; ``hold`` makes a signal wait through a step that must not be cut
(the renames of a commit). An application's own handler is never replaced.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

#: the signals that end a command with its staging folder cleaned (as Ctrl-C does)
CLEAN_EXIT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class Terminated(SystemExit):
    """A termination signal arrived while outputs were being written: raised from the signal
    handler so that every ``finally`` runs (the staging folder is removed); as a ``SystemExit``
    the process ends with status ``128 + signum``, the shell's convention, without a traceback.
    ``committed``: the signal came during the commit, which finished first."""

    def __init__(self, signum: int, committed: bool = False) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.committed = committed


#: signals held back (``signals_held``): nesting depth, and the first one that arrived
_HELD: dict[str, Any] = {"depth": 0, "pending": None}


class SignalGuard:
    """While installed: SIGTERM/SIGHUP raise ``Terminated`` in the main thread (so the
    writer's cleanup runs), or wait until the end of a ``signals_held`` block. The hold is
    process-wide, so whichever guard's handler is installed honours every hold."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread
        for sig in CLEAN_EXIT_SIGNALS:
            try:
                old = signal.getsignal(sig)
                if old is signal.SIG_DFL:  # never override a handler the application set
                    signal.signal(sig, self._handle)
                    self._old[sig] = old
            except (OSError, ValueError):
                pass

    def _handle(self, signum: int, _frame: Any) -> None:
        if _HELD["depth"]:
            _HELD["pending"] = _HELD["pending"] or signum
            return
        self.restore()  # a second signal during the cleanup ends the process at once
        raise Terminated(signum)

    def restore(self) -> None:
        for sig, old in self._old.items():
            with suppress(OSError, ValueError):
                signal.signal(sig, old)
        self._old = {}


@contextmanager
def signals_held() -> Iterator[None]:
    """For the block (a commit's renames: the set must be whole): a termination signal waits,
    and is raised as ``Terminated(committed=True)`` when the block has completed."""
    _HELD["depth"] += 1
    try:
        yield
    except BaseException:
        _HELD["depth"] -= 1
        if not _HELD["depth"]:
            _HELD["pending"] = None  # the block's own error ends the command
        raise
    _HELD["depth"] -= 1
    if not _HELD["depth"] and _HELD["pending"] is not None:
        signum, _HELD["pending"] = _HELD["pending"], None
        raise Terminated(signum, committed=True)


@contextmanager
def clean_exit_on_signals() -> Iterator[None]:
    """For the block: a termination signal raises ``Terminated`` (when no handler is set), so
    the block's own cleanup (a temporary file's removal) runs before the process ends."""
    guard = SignalGuard()
    guard.install()
    try:
        yield
    finally:
        guard.restore()
