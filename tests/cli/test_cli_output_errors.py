"""What the command prints about its outputs: a write that fails (full disk, quota, read-only
mount, permission) names the user's output -- never a private temporary or staging name, never
an input -- and says why in plain words; a finished job's listing never fails on a character
the terminal's encoding lacks; an output path too long leaves no folder behind."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from amct_torch.cli import main
from amct_torch.errors import AmctError
from amct_torch.files import atomic
from amct_torch.files.transaction import make_folder, user_path
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model

DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
         errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}


def _failing_fsync(monkeypatch, code: int) -> None:
    """Every fsync of an output fails with ``code`` (how a full disk shows at the end of a
    write), without a file name, as the kernel reports it."""
    def fsync(fd):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(atomic.os, "fsync", fsync)


@pytest.mark.parametrize("code", sorted(WORDS))
def test_config_into_a_failing_disk_names_the_output_not_the_inputs(tmp_path, monkeypatch, capsys, code):
    model, weights = example_model()
    out = str(tmp_path / "c.json")
    _failing_fsync(monkeypatch, code)
    assert main(["config", model, weights, "-q", "-o", out]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"amct-torch config: error: {out}: ") and WORDS[code] in line, line
    assert model not in line and ".tmp" not in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_convert_into_a_failing_disk_names_the_output_prefix(tmp_path, monkeypatch, capsys, code):
    model, weights = example_model()
    import amct_torch
    res = amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "a" / "m"), device="cpu", quiet=True,
                              report=False, save_type=None, batch_num=1)
    out = str(tmp_path / "b" / "m")
    _failing_fsync(monkeypatch, code)
    assert main(["convert", model, weights, res.files["record"], "-q", "-o", out]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and WORDS[code] in line, line
    assert line.split(": error: ")[1].startswith(out) and ".amct-partial" not in line and ".tmp" not in line
    assert not os.path.exists(tmp_path / "b")


def test_private_names_map_to_the_users_output():
    assert user_path("/o/.m.amct-partial/m_record.txt") == "/o/m_record.txt"
    assert user_path("/o/.m_record.txt.ab12cd34.tmp") == "/o/m_record.txt"
    assert user_path("/o/.m.amct-partial/.m_record.txt.ab_2cd34.tmp") == "/o/m_record.txt"
    assert user_path("/o/.m.amct-partial") == "/o/m"
    assert user_path("/o/.hidden.txt") == "/o/.hidden.txt"  # not one of ours: unchanged


def test_a_folder_path_over_path_max_leaves_no_folder(tmp_path):
    deep = os.path.join(str(tmp_path), "top", *(["abcdefgh"] * 460))
    with pytest.raises(AmctError, match="cannot create the output folder"):
        make_folder(deep)
    assert os.listdir(tmp_path) == []


def test_a_finished_job_prints_under_an_ascii_terminal(tmp_path):
    model, weights = example_model()
    out = str(tmp_path / "r\u00e9sum\u00e9" / "m\u00f6del")
    env = dict(os.environ, PYTHONPATH=ROOT, LANG="C", LC_ALL="C", PYTHONIOENCODING="ascii",
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "amct_torch.cli", "calibrate", model, weights, DATA,
                           "--device", "cpu", "-q", "--batch-num", "1", "--report-batches", "0",
                           "--save-type", "Fakequant", "-o", out], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "r\\xe9sum\\xe9" in proc.stdout and "written:" in proc.stdout
    assert os.path.isfile(out + "_record.txt")
