"""A C compiler that hangs never blocks calibration: the kernel build stops at its time limit
(``AMCT_TORCH_BUILD_TIMEOUT`` lowered here), kills the compiler with the processes it started,
and calibration runs on the torch formulas with one warning."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from amct_torch.kernels import build as native_build
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANGING_CC = """#!/bin/sh
sleep 600 &
echo $! >> "{pids}"
wait
"""


def _hanging_cc(tmp_path) -> tuple[str, str]:
    pids = str(tmp_path / "pids")
    cc = tmp_path / "hanging-cc"
    cc.write_text(HANGING_CC.format(pids=pids))
    cc.chmod(0o755)
    return str(cc), pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def test_build_timeout_reads_the_environment(monkeypatch):
    monkeypatch.delenv("AMCT_TORCH_BUILD_TIMEOUT", raising=False)
    assert native_build.build_timeout() == native_build.BUILD_TIMEOUT_S == 60
    for text, want in (("2.5", 2.5), ("0", 60), ("-1", 60), ("abc", 60), ("inf", 60), ("nan", 60)):
        monkeypatch.setenv("AMCT_TORCH_BUILD_TIMEOUT", text)
        assert native_build.build_timeout() == want, text


def test_a_hanging_compiler_is_stopped_at_the_limit_with_its_children(tmp_path, monkeypatch):
    cc, pids = _hanging_cc(tmp_path)
    monkeypatch.setenv("AMCT_TORCH_BUILD_TIMEOUT", "1.5")
    monkeypatch.setenv("AMCT_TORCH_CACHE", str(tmp_path / "cache"))
    t = time.monotonic()
    with pytest.raises(native_build.BuildTimeout, match="AMCT_TORCH_BUILD_TIMEOUT"):
        native_build.build(cc)
    assert time.monotonic() - t < 10
    started = [int(x) for x in open(pids).read().split()]
    end = time.monotonic() + 10  # SIGKILL is delivered at once; exiting takes a moment
    while any(_alive(p) for p in started) and time.monotonic() < end:
        time.sleep(0.05)
    assert started and not any(_alive(p) for p in started)


def test_calibration_with_a_hanging_compiler_finishes_on_torch_with_one_warning(tmp_path):
    cc, _ = _hanging_cc(tmp_path)
    model, weights = example_model()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CC=cc, AMCT_TORCH_BUILD_TIMEOUT="2", AMCT_TORCH_CACHE=str(tmp_path / "cache"),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("AMCT_TORCH_NATIVE", None)
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "amct_torch.cli", "calibrate", model, weights,
                          os.path.join(EXAMPLE_DIR, "digits_calib.npz"), "--device", "cpu",
                          "--batch-num", "1", "--report-batches", "0", "-o", str(tmp_path / "out" / "m")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert time.monotonic() - t < 200
    warnings = [line for line in res.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "time limit" in warnings[0], res.stderr
    assert os.path.isfile(tmp_path / "out" / "m_record.txt")
