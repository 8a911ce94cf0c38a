"""Let torch's idle OpenMP threads sleep instead of spinning (CLI only, before torch loads).

Why: by default libgomp's worker threads spin for a while at every barrier, waiting for the
next parallel region. On a machine whose cores are busy with other work, the spinning threads
take CPU from the thread the region waits for: the 32-image nsfw job measured 16–17 s wall
and 8–9 s CPU with spinning against 4.6–6 s and 3.6 s with ``OMP_WAIT_POLICY=PASSIVE``, at a
load average of 7.6 on 2 cores. A calibration job's parallel regions are whole convolutions
and histogram passes (milliseconds), so the wake-up of a sleeping thread (microseconds) costs
nothing measurable on a quiet machine. The policy is read once, when the OpenMP runtime
starts, so it must be set before torch is imported; a value the user set is kept.
"""
from __future__ import annotations

import os
import sys


def prefer_passive_waits() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process unless the user chose a policy or
    torch is already loaded; True when it was set here."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
