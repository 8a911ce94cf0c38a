"""The process's own plumbing: helper threads, thread and allocator settings, job progress and
the package's names imported on first use (``lazy_names``, which this front door uses too:
its names are imported when first read, and none of its modules needs torch)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    "HelperThread": "amct_torch.runtime.helper_thread",
    "keep_freed_memory": "amct_torch.runtime.malloc_tuning",
    **{n: "amct_torch.runtime.progress" for n in ("JobProgress", "progress_enabled")},
    "prefer_passive_waits": "amct_torch.runtime.threads",
}

__all__ = ["HelperThread", "JobProgress", "keep_freed_memory", "lazy_names", "prefer_passive_waits",
           "progress_enabled"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.runtime.helper_thread import HelperThread
    from amct_torch.runtime.malloc_tuning import keep_freed_memory
    from amct_torch.runtime.progress import JobProgress, progress_enabled
    from amct_torch.runtime.threads import prefer_passive_waits
