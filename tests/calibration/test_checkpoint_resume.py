"""Save and resume a calibration: a process really killed (SIGKILL) after half its batches, a
new process resumes from the checkpoint → the same record as an uninterrupted run.

The uninterrupted reference is the AMCT user loop over the model ``quantize_model`` returns.
Run as a script, this file is the process that gets killed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

if __name__ == "__main__":  # run as a script by the test itself: tests/ holds the helpers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.checkpoint_job import batches, setup  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILL_AT = 3          # the process dies when asked for batch index 3 (3 batches done)


def run(tmp: str, mode: str, tag: str, kill_at=None) -> str:
    """Calibrate with a checkpoint; ``exact`` through the AMCT user loop with ``attach()``, the
    others through ``run_calibration(checkpoint=...)`` (what quantize() uses)."""
    from amct_torch.calibration.checkpoint import Checkpointer
    from amct_torch.calibration.loop import run_calibration
    graph, m = setup(tmp, mode, tag)
    ckpt = os.path.join(tmp, f"{mode}.ckpt")
    if mode == "exact":
        cp = Checkpointer(graph.session, ckpt).attach()
        done = cp.resume()
        with torch.no_grad():
            for i, b in enumerate(batches(kill_at)):
                if i >= done:
                    m(b)
    else:
        run_calibration(m, graph.session, batches(kill_at), torch.device("cpu"), quiet=True, checkpoint=ckpt)
    assert graph.session.done
    return graph.record_file


def reference(tmp: str, mode: str):
    from amct_torch.record import read_record
    graph, m = setup(tmp, mode, "ref")
    with torch.no_grad():
        for b in batches():
            m(b)
    return read_record(graph.record_file)


@pytest.mark.parametrize("mode", ["exact", "streaming", "hfmg"])
def test_killed_then_resumed_gives_same_record(tmp_path, mode):
    from amct_torch.record import read_record
    tmp = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), tmp, mode], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpt = os.path.join(tmp, f"{mode}.ckpt")
    assert os.path.isfile(ckpt)
    # the checkpoint holds exactly the batches done before the kill, as tensors only
    state = torch.load(ckpt, weights_only=True)
    assert int(state["batches_seen"]) == KILL_AT
    resumed = read_record(run(tmp, mode, "resumed"))
    assert not os.path.exists(ckpt)           # removed once the calibration finished
    ref = reference(tmp, mode)
    assert list(resumed) == list(ref)
    for name, r in ref.items():
        d = resumed[name]
        assert (d.scale_d, d.offset_d, d.channels, d.height, d.width) == \
            (r.scale_d, r.offset_d, r.channels, r.height, r.width), name
        assert d.scale_w == r.scale_w, name


def test_resume_without_restore_would_differ(tmp_path):
    """The comparison above can fail: calibrating only the second half gives another record."""
    from amct_torch.record import read_record
    graph, m = setup(str(tmp_path), "exact", "half")
    with torch.no_grad():
        for i, b in enumerate(batches()):
            if i >= KILL_AT:
                m(b)
    graph.session.finish()
    half = read_record(graph.record_file)
    ref = reference(str(tmp_path), "exact")
    assert any(half[n].scale_d != ref[n].scale_d for n in ref)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    run(sys.argv[1], sys.argv[2], "killed", kill_at=KILL_AT)
