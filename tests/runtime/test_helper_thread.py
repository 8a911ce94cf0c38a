"""Waiting for a helper thread through signals: the caller never leaves before the thread has
stopped, and the signal's exception is not lost (Thread.join() promises neither on 3.11)."""
from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from amct_torch.runtime.helper_thread import HelperThread
from amct_torch.workflow.side_by_side import side_by_side

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGALRM (POSIX)")


class Alarm(Exception):
    pass


@pytest.fixture
def alarm_in():
    """``alarm_in(s)``: raise ``Alarm`` in the main thread after ``s`` seconds, once."""
    def handler(signum, frame):
        raise Alarm()
    old = signal.signal(signal.SIGALRM, handler)
    yield lambda s: signal.setitimer(signal.ITIMER_REAL, s)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _slow(seconds: float, done: list):
    def run():
        time.sleep(seconds)
        done.append("stopped")
        return "result"
    return run


def test_a_signal_during_the_wait_is_raised_after_the_thread_stopped(alarm_in):
    done: list = []
    helper = HelperThread(_slow(0.6, done), "test-helper")
    alarm_in(0.1)
    with pytest.raises(Alarm):
        helper.wait()
    assert done == ["stopped"] and helper.result == "result"
    helper.wait()  # done: returns at once


def test_side_by_side_raises_the_signal_once_both_stopped(alarm_in):
    done: list = []
    alarm_in(0.1)
    with pytest.raises(Alarm):
        side_by_side(_slow(0.6, done), lambda: "second")
    assert done == ["stopped"]
    assert not [t for t in threading.enumerate() if t.name == "amct-side-by-side"]


def test_a_signal_while_the_second_fails_still_waits_for_the_first(alarm_in):
    done: list = []

    def second():
        alarm_in(0.1)
        raise OSError("disk full")

    with pytest.raises((Alarm, OSError)):
        side_by_side(_slow(0.6, done), second)
    assert done == ["stopped"]


def test_the_helpers_error_comes_back():
    def boom():
        raise ValueError("in the helper")
    helper = HelperThread(boom, "test-helper")
    helper.wait()
    assert isinstance(helper.error, ValueError) and helper.result is None


def test_sigterm_while_the_job_waits_for_its_exports_publishes_nothing(tmp_path, monkeypatch):
    """A termination signal arriving while the job waits for the Caffe export on its helper
    thread: the job ends with the signal's status once that thread stopped, and no output is
    published (an earlier version returned normally with the Caffe models missing)."""
    import os

    import numpy as np

    from amct_torch.export.caffe.exporter import CaffeExporter
    from amct_torch.export.onnx.exporter import OnnxExporter
    from amct_torch.workflow import quantize
    from helpers.caffe_nets import make_net, rand

    body = ('layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" '
            'convolution_param { num_output: 6 kernel_size: 3 } } '
            'layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }')
    proto, weights = make_net(tmp_path, body, {"data": [1, 3, 8, 8]},
                              {"conv1": [rand(6, 3, 3, 3, seed=1), rand(6, seed=2)]})
    data = tmp_path / "x.npy"
    np.save(data, rand(4, 3, 8, 8, seed=3))
    caffe, onnx_models = CaffeExporter.write, OnnxExporter.write
    caffe_done = []

    def slow_caffe(*a, **k):
        time.sleep(1.0)
        out = caffe(*a, **k)
        caffe_done.append(1)
        return out

    def onnx_then_sigterm(*a, **k):
        out = onnx_models(*a, **k)
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        return out

    monkeypatch.setattr(CaffeExporter, "write", slow_caffe)
    monkeypatch.setattr(OnnxExporter, "write", onnx_then_sigterm)
    out = tmp_path / "out" / "m"
    with pytest.raises(SystemExit) as ended:
        quantize(proto, weights, str(data), output=str(out), save_type="Both", onnx=True,
                 report=False, quiet=True)
    assert ended.value.code == 128 + signal.SIGTERM
    assert caffe_done == [1]  # the helper ran to its end before the job left
    assert not out.parent.exists() or os.listdir(out.parent) == []
