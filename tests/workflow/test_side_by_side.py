"""Exports at once: the outcome of running them in order, and nobody left writing."""
from __future__ import annotations

import threading
import time

import pytest

from amct_torch.workflow.side_by_side import side_by_side


def test_both_run_at_the_same_time_and_both_results_come_back():
    seen = threading.Event()

    def first():
        # only returns True if the second is running meanwhile (in order it would time out)
        return seen.wait(timeout=10)

    def second():
        seen.set()
        return "b"

    assert side_by_side(first, second) == (True, "b")


def test_one_alone_runs_on_the_callers_thread():
    me = threading.get_ident()
    assert side_by_side(lambda: threading.get_ident() == me) == (True,)
    assert side_by_side(lambda: threading.get_ident() != me, lambda: threading.get_ident() == me) == (True, True)
    assert side_by_side() == ()


def test_the_first_ones_error_wins_as_in_order():
    def first():
        time.sleep(0.2)
        raise ValueError("first")

    def second():
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        side_by_side(first, second)


@pytest.mark.parametrize("second_fails", [False, True])
def test_the_caller_leaves_only_after_the_helper_stopped(second_fails):
    done = []

    def first():
        time.sleep(0.3)
        done.append("first")

    def second():
        if second_fails:
            raise OSError("disk full")
        return 1

    if second_fails:
        with pytest.raises(OSError, match="disk full"):
            side_by_side(first, second)
    else:
        side_by_side(first, second)
    assert done == ["first"]


def test_an_interrupt_in_the_callers_work_wins_once_the_helper_stopped():
    done = []

    def first():
        time.sleep(0.2)
        done.append(1)
        raise ValueError("would have come later")

    def second():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        side_by_side(first, second)
    assert done == [1]


def test_three_run_at_the_same_time_and_the_earliest_error_wins():
    started = threading.Barrier(3, timeout=10)

    def work(name, fails=False):
        def run():
            started.wait()  # only passes when all three run at once
            if fails:
                raise ValueError(name)
            return name
        return run

    assert side_by_side(work("a"), work("b"), work("c")) == ("a", "b", "c")
    started.reset()
    with pytest.raises(ValueError, match="b"):
        side_by_side(work("a"), work("b", True), work("c", True))


def test_the_caller_leaves_only_after_every_helper_stopped():
    done = []

    def slow(delay):
        def run():
            time.sleep(delay)
            done.append(delay)
        return run

    def last():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        side_by_side(slow(0.3), slow(0.1), last)
    assert sorted(done) == [0.1, 0.3]


def test_a_helper_that_cannot_start_leaves_none_of_the_started_ones_running(monkeypatch):
    # a signal (Terminated) or "can't start new thread" while the second helper starts: the
    # first one, already writing into the staging folder, is waited for before the error leaves
    import amct_torch.workflow.side_by_side as sbs

    real, made = sbs.HelperThread, []

    def starting(fn, name):
        if made:
            raise RuntimeError("can't start new thread")
        made.append(real(fn, name))
        return made[0]

    monkeypatch.setattr(sbs, "HelperThread", starting)
    finished = threading.Event()

    def slow():
        time.sleep(0.3)
        finished.set()

    with pytest.raises(RuntimeError, match="can't start new thread"):
        side_by_side(slow, lambda: None, lambda: None)
    assert finished.is_set()
