"""On a busy machine, let torch's idle OpenMP threads sleep instead of spinning (CLI only, before
torch loads).

Why: libgomp's worker threads spin at every barrier; when other work already takes the cores,
the spinning threads take CPU from the thread the region waits for (on 2 busy cores the 32-image
nsfw job took 12.5 s spinning, 5.3 s passive). So the policy follows the load: passive when more
processes are runnable than there are cores (the 1-minute load average), torch's default
otherwise. It must be set before torch is imported; a policy the user set is kept.
docs/performance.md."""
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
