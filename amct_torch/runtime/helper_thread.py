"""A function run on a daemon thread, waited for through signals.

Why: the job's helper threads (the side-by-side exports, the float ONNX model written during
calibration) write into the job's staging folder, which the job removes on its way out. The
job must therefore never leave before such a thread has stopped -- also when a SIGTERM or a
Ctrl-C arrives while it waits. ``Thread.join()`` cannot promise that: on Python 3.11, when the
signal handler raises inside ``join()``, the thread is marked stopped while it still runs, and
every later ``join()`` returns at once. So the thread sets an ``Event`` when its function has
returned or raised, and ``wait()`` waits on that event, again after each interruption; the
first interruption is raised once the thread is done.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

__all__ = ["HelperThread"]


class HelperThread:
    """``fn()`` on a daemon thread named ``name``, started at once."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._fn = fn
        self._done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread by wait()
            self.error = err
        finally:
            self._fn = None  # type: ignore[assignment]  # what it referenced can go
            self._done.set()

    def wait(self) -> None:
        """Return once ``fn`` has returned or raised (its outcome is in ``result``/``error``);
        an exception raised here meanwhile (a signal handler's) is raised after that."""
        pending: Optional[BaseException] = None
        while True:
            try:
                self._done.wait()
                break
            except BaseException as err:  # noqa: BLE001 - raised below, once the thread is done
                if pending is None:
                    pending = err
        if pending is not None:
            raise pending
