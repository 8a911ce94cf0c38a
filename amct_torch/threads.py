"""On a busy machine, let torch's idle OpenMP threads sleep instead of spinning (CLI only,
before torch loads).

Why: by default libgomp's worker threads spin for a while at every barrier, waiting for the
next parallel region. When the cores are already taken by other work, the spinning threads
take CPU from the thread the region waits for. Measured on the 32-image nsfw job on 2 cores
(medians): with 4 other busy processes, spinning 12.5 s wall / 7.4 s CPU, a short spin
(``GOMP_SPINCOUNT=20000``) 9.5 s / 5.1 s, ``OMP_WAIT_POLICY=PASSIVE`` 5.3 s / 2.2 s; on the
nearly idle machine (load 1.1) spinning 1.84 s, the short spin 1.82 s, passive 2.07 s. So the
policy follows the load: passive when more processes are runnable than there are cores (the
1-minute load average), torch's default otherwise. It is read once, when the OpenMP runtime
starts, so it must be set before torch is imported; a policy the user set is kept.
"""
from __future__ import annotations

import os
import sys
from typing import Optional


def prefer_passive_waits(load: Optional[float] = None) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process when the machine is busy (``load``,
    default the 1-minute load average, above the number of CPUs), unless the user chose a
    policy or torch is already loaded; True when it was set here."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average on this system
            return False
    if load <= (os.cpu_count() or 1):
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
