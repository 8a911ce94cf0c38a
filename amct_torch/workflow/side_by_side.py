"""Two pieces of work at once: the first on a helper thread, the second on the caller's.

Why: the job writes the Caffe models and the ONNX models from the same calibrated graph, and
neither reads what the other writes; side by side their waits (quantizing blobs, the disk, ONNX
Runtime's check) overlap. The outcome is that of running them in order: the first one's error
wins, and the caller never leaves before the helper thread has stopped, so the clean-up never
removes a folder the other is still writing into."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

from amct_torch.runtime import HelperThread

__all__ = ["side_by_side"]


def side_by_side(first: Optional[Callable[[], Any]], second: Optional[Callable[[], Any]]) -> tuple[Any, Any]:
    """``(first(), second())``, run at the same time when both are given (None: not run, its
    result None)."""
    if first is None or second is None:
        return (first() if first is not None else None), (second() if second is not None else None)
    helper = HelperThread(first, "amct-side-by-side")
    try:
        out = second()
    except Exception:
        helper.wait()  # an interrupt while waiting is raised from here, once the helper stopped
        if helper.error is not None:  # in order, the first one's error would have come first
            raise helper.error from None
        raise
    except BaseException:  # an interrupt or a termination signal: it wins, once the helper stopped
        with contextlib.suppress(BaseException):  # the one already on its way is raised
            helper.wait()
        raise
    helper.wait()
    if helper.error is not None:
        raise helper.error
    return helper.result, out
