"""SIGKILL during a real ``amct-torch calibrate`` over an earlier run's outputs never tears a file,
never loses the earlier set and never leaves a mixed set.

Two complete reference runs (A: 1 batch, B: 2 batches: different records, reports and
models) give the bytes each final file may have. Each case starts from A's outputs, runs B's
command and kills it — at a chosen step of writing/committing (the process SIGKILLs itself
just before its K-th file-system call) or after a delay (during calibration). Afterwards:
without a commit manifest the folder holds exactly A's set; then the recovery that the next
command runs first leaves exactly A's or exactly B's set, and nothing else in the folder or
in the temp folder. The temp folder is on another filesystem (a tmpfs when /dev/shm is one)
and on the same one.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from amct_torch.files.transaction import MANIFEST, recover, staging_folder
from amct_torch.record import read_record
from amct_torch.workflow.examples import EXAMPLE_DIR
from helpers.kill import SUFFIXES, final_set, run_cli

MODEL = os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt")
WEIGHTS = os.path.join(EXAMPLE_DIR, "lenet_digits.caffemodel")
DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")


def _args(prefix: str, batches: int) -> list[str]:
    return ["calibrate", MODEL, WEIGHTS, DATA, "--batch-size", "16", "--batch-num", str(batches),
            "--device", "cpu", "--report-batches", "1", "-q", "-o", prefix]


def _env(tmpdir: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return dict(os.environ, TMPDIR=tmpdir, OMP_NUM_THREADS="1",
                PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _other_fs_tmp(base: str, out_dir: str) -> str:
    """A temp folder on another filesystem than ``out_dir`` (/dev/shm when it is a tmpfs of
    its own), else a second folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(out_dir).st_dev:
        import tempfile
        return tempfile.mkdtemp(prefix="amct_kill_", dir=shm)
    path = os.path.join(base, "other_tmp")
    os.makedirs(path, exist_ok=True)
    return path


def check_after_kill(prefix: str, ref_a: dict, ref_b: dict, tmpdir: str) -> str:
    """Assert the state a kill left; returns "old" or "new" (which set is in place)."""
    staging = staging_folder(prefix)
    committed = os.path.isfile(os.path.join(staging, MANIFEST))
    before = final_set(prefix)
    if not committed:
        assert before in (ref_a, ref_b), "torn or mixed outputs without a commit manifest"
    recover(staging)
    after = final_set(prefix)
    assert after in (ref_a, ref_b), "torn or mixed outputs after recovery"
    if committed:
        assert after == ref_b
    for s in SUFFIXES:  # every final-name file parses
        if s.endswith("_record.txt"):
            assert read_record(prefix + s)
        elif s.endswith(".json"):
            json.loads(after[s])
    folder = os.path.dirname(prefix)
    assert sorted(os.listdir(folder)) == sorted(os.path.basename(prefix) + s for s in SUFFIXES)
    ours = [n for n in os.listdir(tmpdir) if not n.startswith("torchinductor")]  # torch's cache
    assert ours == [], "a killed run left files in the temp folder"
    return "old" if after == ref_a else "new"


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill_refs")
    tmp = str(base / "tmp")
    os.makedirs(tmp)
    refs = {}
    for name, batches in (("a", 1), ("b", 2)):
        prefix = str(base / name / "m")
        assert run_cli(_args(prefix, batches), _env(tmp), count_file=str(base / f"{name}.n")) == 0
        refs[name] = final_set(prefix)
        assert all(v is not None for v in refs[name].values())
        refs[name + "_steps"] = int((base / f"{name}.n").read_text())
    assert refs["a"]["_record.txt"] != refs["b"]["_record.txt"]
    refs["a_dir"] = str(base / "a")
    return refs


def _fresh(case_dir: str, refs: dict) -> str:
    shutil.copytree(refs["a_dir"], case_dir)
    return os.path.join(case_dir, "m")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["other_fs", "same_fs"])
def test_kills_leave_one_complete_set(tmp_path, references, layout):
    refs = references
    out_root = tmp_path / "out"
    out_root.mkdir()
    tmp = _other_fs_tmp(str(tmp_path), str(out_root)) if layout == "other_fs" else str(tmp_path / "tmp")
    os.makedirs(tmp, exist_ok=True)
    try:
        steps = refs["b_steps"]
        # the last ~17 steps are the commit (manifest, renames, cleanup): every 4th of them,
        # and one step of the earlier writing (the full sweep is benchmarks/bench_hostile.py)
        points = [steps // 3] + list(range(steps - 17, steps + 1, 4))
        outcomes = []
        for i, k in enumerate(points):
            prefix = _fresh(str(out_root / f"k{i}"), refs)
            rc = run_cli(_args(prefix, 2), _env(tmp), kill_at=k)
            assert rc == -9
            outcomes.append(check_after_kill(prefix, refs["a"], refs["b"], tmp))
        assert "old" in outcomes and "new" in outcomes
        if layout == "same_fs":
            return
        prefix = _fresh(str(out_root / "timed"), refs)  # a kill during calibration
        run_cli(_args(prefix, 2), _env(tmp), kill_after_s=3.0)
        check_after_kill(prefix, refs["a"], refs["b"], tmp)
        # the next run over a killed run's leftovers completes normally
        prefix = _fresh(str(out_root / "next"), refs)
        run_cli(_args(prefix, 2), _env(tmp), kill_at=steps - 3)
        assert run_cli(_args(prefix, 2), _env(tmp)) == 0
        assert final_set(prefix) == refs["b"]
        assert not os.path.exists(staging_folder(prefix))
    finally:
        if layout == "other_fs" and tmp.startswith("/dev/shm"):
            shutil.rmtree(tmp, ignore_errors=True)
