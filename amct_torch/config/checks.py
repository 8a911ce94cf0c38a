"""Range checks shared by the quant.cfg and JSON readers (docs/config_and_record.md), so both file forms
refuse the same values with the same words. Each check returns an error text or None; the
caller adds the file and the layer/section."""
from __future__ import annotations

import math
from typing import Optional

#: the histogram sizes HFMG supports
HFMG_BINS = (1024, 2048, 4096, 8192)

#: most IFMR candidates a search grid may have (the default 0.7..1.3 step 0.01 has 60): the
#: search keeps one loss per candidate, so a tiny search_step in a small file would otherwise
#: make the tool allocate gigabytes
MAX_IFMR_CANDIDATES = 10000


def check_percentile(name: str, value: float) -> Optional[str]:
    """Percentiles lie in (0.5, 1]."""
    if not (math.isfinite(value) and 0.5 < value <= 1.0):
        return f"{name} must be in (0.5, 1], got {value!r}"
    return None


def check_search(start: float, end: float, step: float) -> Optional[str]:
    """0 < search_range_start < search_range_end and 0 < search_step <= end - start."""
    if not all(math.isfinite(v) for v in (start, end, step)):
        return f"search range and step must be finite numbers, got {start!r}, {end!r}, {step!r}"
    if not 0.0 < start < end:
        return (f"search range must satisfy 0 < search_range_start < search_range_end, got "
                f"start {start!r}, end {end!r}")
    if not 0.0 < step <= end - start:
        return (f"search_step must satisfy 0 < search_step <= search_range_end - "
                f"search_range_start = {end - start!r}, got {step!r}")
    count = (end - start) / step + 1  # float64: no overflow for any finite inputs
    if not count <= MAX_IFMR_CANDIDATES:
        return (f"search_step {step!r} over the range [{start!r}, {end!r}] gives "
                f"{count:.3g} IFMR candidates; at most {MAX_IFMR_CANDIDATES} are allowed "
                "(raise search_step or narrow search_range)")
    return None


def check_bins(bins: int) -> Optional[str]:
    """HFMG supports 1024, 2048, 4096 or 8192 bins."""
    if bins not in HFMG_BINS:
        return f"num_of_bins must be one of {', '.join(map(str, HFMG_BINS))}, got {bins!r}"
    return None
