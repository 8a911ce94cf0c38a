"""Two pieces of work at once: the first on a helper thread, the second on the caller's.

Why: the job writes the Caffe models and the ONNX models from the same calibrated graph, and
neither reads what the other writes. Written one after the other, each spends much of its time
waiting: the Caffe writers on quantizing and framing blobs, the ONNX writer on the disk taking
its direct writes and on ONNX Runtime's check of the file. Side by side the waits overlap.

The outcome is the one of running them in order: the first one's error wins over the
second's, and the caller's thread never leaves (with a result, an error or an interrupt)
before the helper thread has stopped -- so the job's clean-up never removes a folder the
other is still writing into.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

__all__ = ["side_by_side"]


def side_by_side(first: Optional[Callable[[], Any]], second: Optional[Callable[[], Any]]) -> tuple[Any, Any]:
    """``(first(), second())``, run at the same time when both are given (None: not run, its
    result None)."""
    if first is None or second is None:
        return (first() if first is not None else None), (second() if second is not None else None)
    box: dict[str, Any] = {}

    def run_first() -> None:
        try:
            box["result"] = first()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = err

    helper = threading.Thread(target=run_first, name="amct-side-by-side", daemon=True)
    helper.start()
    try:
        out = second()
    except Exception:
        _join(helper)
        if "error" in box:  # in order, the first one's error would have come first
            raise box["error"] from None
        raise
    except BaseException:  # an interrupt or a termination signal: it wins, once the helper stopped
        _join(helper)
        raise
    _join(helper)
    if "error" in box:
        raise box["error"]
    return box.get("result"), out


def _join(helper: threading.Thread) -> None:
    """Wait for ``helper`` to stop, even through further signals (it stops within the time of
    its own work; leaving earlier would let the caller's clean-up race its writes)."""
    while True:
        try:
            helper.join()
            return
        except BaseException:  # noqa: BLE001 - the error already on its way is the one raised
            continue
