"""Pieces of work at once: each but the last on a helper thread, the last on the caller's.

Why: the job writes each output format (the Caffe models, the ONNX models, ...) from the same
calibrated graph, and none reads what another writes; side by side their waits (quantizing
blobs, the disk, ONNX Runtime's check) overlap. The outcome is that of running them in order:
the first one's error wins, and the caller never leaves before every helper thread has
stopped, so the clean-up never removes a folder another is still writing into."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

from amct_torch.runtime import HelperThread

__all__ = ["side_by_side"]


def side_by_side(*works: Callable[[], Any]) -> tuple[Any, ...]:
    """``(works[0](), works[1](), ...)``, run at the same time; the last one runs on the
    caller's thread (alone: no thread is started)."""
    if not works:
        return ()
    *others, last = works
    helpers: list[HelperThread] = []
    try:
        for work in others:
            helpers.append(HelperThread(work, "amct-side-by-side"))
    except BaseException:  # one could not start (a signal, no thread left): the started ones stop first
        with contextlib.suppress(BaseException):
            _wait_all(helpers)
        raise
    try:
        result = last()
    except Exception:
        _wait_all(helpers)  # an interrupt while waiting is raised from here, once all stopped
        _raise_first(helpers)  # in order, an earlier one's error would have come first
        raise
    except BaseException:  # an interrupt or a termination signal: it wins, once the helpers stopped
        with contextlib.suppress(BaseException):  # the one already on its way is raised
            _wait_all(helpers)
        raise
    _wait_all(helpers)
    _raise_first(helpers)
    return (*(helper.result for helper in helpers), result)


def _raise_first(helpers: list[HelperThread]) -> None:
    """Raise the error of the first helper (in the works' order) that failed."""
    for helper in helpers:
        if helper.error is not None:
            raise helper.error from None


def _wait_all(helpers: list[HelperThread]) -> None:
    """Wait for every helper; the first interruption meanwhile is raised once all stopped."""
    pending: Optional[BaseException] = None
    for helper in helpers:
        try:
            helper.wait()
        except BaseException as err:  # noqa: BLE001 - raised below, once every helper stopped
            pending = pending or err
    if pending is not None:
        raise pending
