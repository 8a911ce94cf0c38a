"""Job progress: which phase of a long command is running, and how long each phase took.

Why: a calibration job spends seconds in phases that are not calibration (reading the model,
BN fusion and ARQ, writing each output model, the report). A user watching a terminal should
see where the time goes, and ``-v`` should say how long each phase took. Phases are started
one after the other (``start`` ends the previous one), so the job's code gains one line per
phase instead of a nested block.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Optional

log = logging.getLogger("amct_torch")


def progress_enabled(quiet: bool = False) -> bool:
    """Progress bars only on an interactive stderr and when not asked to be quiet."""
    return not quiet and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


class JobProgress:
    """A bar over the job's phases (shown when ``enabled``), and ``times``: phase -> seconds.

    ``total`` is the number of phases the job expects; the bar's description is the phase now
    running. Every finished phase is logged at INFO level with its time."""

    def __init__(self, total: int, enabled: bool = True, desc: str = "amct-torch") -> None:
        self.times: dict[str, float] = {}
        self._name: Optional[str] = None
        self._t0 = 0.0
        self._bar = None
        if enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, unit="phase", file=sys.stderr, leave=False,
                             bar_format="{desc}: {n_fmt}/{total_fmt} phases [{elapsed}]")

    def start(self, name: str) -> None:
        """End the running phase (if any) and start ``name``."""
        self._end()
        self._name, self._t0 = name, time.perf_counter()
        if self._bar is not None:
            self._bar.set_description_str(name)

    def _end(self) -> None:
        if self._name is None:
            return
        dt = time.perf_counter() - self._t0
        self.times[self._name] = self.times.get(self._name, 0.0) + dt
        log.info("%s: %.2f s", self._name, dt)
        self._name = None
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        """End the running phase and remove the bar (also after an error)."""
        self._end()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
