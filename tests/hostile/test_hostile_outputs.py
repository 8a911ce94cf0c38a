"""Outputs as a transaction (amct_torch/files/transaction.py) and the calls that use it: inputs are
never overwritten, an existing folder is never taken for a file, final files follow the umask,
missing output folders are created (and removed again when the command fails), a live run's
staging folder is not touched, and a committed run killed while renaming is finished by the
next one."""
from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest

import amct_torch
from amct_torch.errors import AmctError, DataError
from amct_torch.files.transaction import MANIFEST, OutputTransaction, recover, staging_folder
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model

DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")


def _copy_model(tmp_path):
    model, weights = example_model()
    return shutil.copy(model, tmp_path / "m.prototxt"), shutil.copy(weights, tmp_path / "w.caffemodel")


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_config_output_equal_to_the_model_is_refused_and_the_model_kept(tmp_path):
    model, weights = _copy_model(tmp_path)
    before = _bytes(model)
    with pytest.raises(AmctError, match="overwrite the input") as err:
        amct_torch.create_quant_config(model, model, weights)
    assert str(model) in str(err.value)
    assert _bytes(model) == before


def test_init_record_equal_to_the_prototxt_is_refused(tmp_path):
    model, weights = _copy_model(tmp_path)
    cfg = str(tmp_path / "c.json")
    amct_torch.create_quant_config(cfg, model, weights)
    before = _bytes(model)
    with pytest.raises(AmctError, match="overwrite the input"):
        amct_torch.init(cfg, model, weights, model)
    assert _bytes(model) == before


def test_quantize_output_named_like_an_input_is_refused_before_any_work(tmp_path):
    # the user's weights are called like the record output of prefix "net"
    model, weights = _copy_model(tmp_path)
    victim = shutil.copy(weights, tmp_path / "net_record.txt")
    before = _bytes(victim)
    with pytest.raises(AmctError, match="overwrite the input"):
        amct_torch.quantize(model, victim, DATA, output=str(tmp_path / "net"), device="cpu",
                            quiet=True, report=False)
    assert _bytes(victim) == before
    assert not os.path.exists(staging_folder(str(tmp_path / "net")))


def test_existing_folder_at_an_output_path_is_refused(tmp_path):
    model, weights = _copy_model(tmp_path)
    (tmp_path / "out_record.txt").mkdir()
    with pytest.raises(AmctError, match="existing folder") as err:
        amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "out"), device="cpu",
                            quiet=True, report=False)
    assert "out_record.txt" in str(err.value)
    assert os.listdir(tmp_path / "out_record.txt") == []


def test_final_files_follow_the_umask(tmp_path):
    model, weights = _copy_model(tmp_path)
    old = os.umask(0o027)
    try:
        res = amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "o" / "m"),
                                  device="cpu", quiet=True, report=False, batch_num=1)
        amct_torch.convert_model(model, weights, res.files["record"], str(tmp_path / "c" / "m"))
    finally:
        os.umask(old)
    files = list(res.files.values()) + [str(p) for p in (tmp_path / "c").iterdir()]
    assert len(files) >= 10
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o640, p


def test_convert_creates_missing_folders_and_names_no_temp_file(tmp_path):
    model, weights = _copy_model(tmp_path)
    res = amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "a" / "m"),
                              device="cpu", quiet=True, report=False, batch_num=1, save_type=None)
    written = amct_torch.convert_model(model, weights, res.files["record"],
                                       str(tmp_path / "new" / "deeper" / "model"))
    assert sorted(os.path.basename(p) for p in written) == sorted(os.listdir(tmp_path / "new" / "deeper"))
    assert all(os.path.dirname(p) == str(tmp_path / "new" / "deeper") for p in written)


def test_failed_run_removes_the_folders_it_created(tmp_path):
    model, weights = _copy_model(tmp_path)
    bad = [np.zeros((4, 3, 16, 16), np.float32)]  # 3 channels: the net takes 1
    with pytest.raises(DataError):
        amct_torch.quantize(model, weights, bad, output=str(tmp_path / "x" / "y" / "m"),
                            device="cpu", quiet=True)
    assert not os.path.exists(tmp_path / "x")


def test_staging_folder_of_a_live_run_is_not_touched(tmp_path):
    finals = [str(tmp_path / "m_a.txt"), str(tmp_path / "m_b.txt")]
    tx = OutputTransaction(finals).begin("m")
    try:
        with open(tx.staged(finals[0]), "w") as f:
            f.write("in progress")
        with pytest.raises(AmctError, match="another amct-torch run"):
            OutputTransaction(finals).begin("m")
        assert os.path.exists(tx.staged(finals[0]))
    finally:
        tx.abort()
    assert not os.path.exists(staging_folder(str(tmp_path / "m")))


def test_commit_publishes_all_and_recover_finishes_a_killed_commit(tmp_path):
    finals = [str(tmp_path / f"m_{k}.txt") for k in "abc"]
    for p in finals:
        with open(p, "w") as f:
            f.write("old")
    tx = OutputTransaction(finals).begin("m")
    for p in finals:
        with open(tx.staged(p), "w") as f:
            f.write("new")
    # what a kill after the commit point and one rename leaves
    staging = tx.staging
    with open(os.path.join(staging, MANIFEST), "w") as f:
        json.dump({"moves": [os.path.basename(p) for p in finals]}, f)
    os.replace(tx.staged(finals[0]), finals[0])
    os.close(tx._lock)  # the killed process's lock is gone with it
    tx._lock = None
    tx.staging = None
    assert [open(p).read() for p in finals] == ["new", "old", "old"]  # mixed until recovered
    assert sorted(recover(staging)) == sorted(finals[1:])
    assert [open(p).read() for p in finals] == ["new"] * 3
    assert not os.path.exists(staging)


def test_uncommitted_staging_is_discarded(tmp_path):
    finals = [str(tmp_path / "m_a.txt")]
    with open(finals[0], "w") as f:
        f.write("old")
    tx = OutputTransaction(finals).begin("m")
    with open(tx.staged(finals[0]), "w") as f:
        f.write("half")
    staging = tx.staging
    os.close(tx._lock)
    tx._lock, tx.staging = None, None
    assert recover(staging) == []
    assert open(finals[0]).read() == "old" and not os.path.exists(staging)


def test_default_batch_size_uses_every_sample(tmp_path):
    """digits_calib.npz holds 180 samples (counted here with numpy): batch_num 2 without a
    batch size calibrates on all of them, and the summary says so."""
    import io

    from amct_torch.commands.printing import print_summary
    with np.load(DATA) as z:
        total = z["inputs"].shape[0]
    model, weights = _copy_model(tmp_path)
    res = amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "m"), device="cpu",
                              quiet=True, report=False, batch_num=2)
    assert (res.samples_used, res.samples_total) == (total, total)
    out = io.StringIO()
    print_summary(res, out)
    assert f"{total} of {total} sample(s)" in out.getvalue()


def test_unused_samples_and_ignored_mean_are_warned(tmp_path, caplog):
    model, weights = _copy_model(tmp_path)
    with caplog.at_level("WARNING", logger="amct_torch"):
        res = amct_torch.quantize(model, weights, DATA, output=str(tmp_path / "m"), device="cpu",
                                  quiet=True, report=False, batch_num=1, batch_size=8,
                                  preprocess=amct_torch.Preprocess(mean=(0.5,)))
    assert res.samples_used == 8
    text = caplog.text
    assert "calibrated on 8 of 180 samples" in text and "172 sample(s) unused" in text
    assert "--mean/--scale" in text


def test_full_disk_while_writing_keeps_the_previous_outputs(tmp_path, monkeypatch):
    """A write failing with ENOSPC in the middle of the outputs: AmctError naming the final
    output (not the staging copy), and the earlier run's files all unchanged."""
    import errno

    import amct_torch.files.atomic as atomic
    model, weights = _copy_model(tmp_path)
    prefix = str(tmp_path / "o" / "m")
    first = amct_torch.quantize(model, weights, DATA, output=prefix, device="cpu", quiet=True,
                                report=False, batch_num=1)
    before = {p: _bytes(p) for p in first.files.values()}
    real = atomic.atomic_write_bytes

    def full_disk(path, data):
        if path.endswith("_deploy_model.prototxt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, data)
    monkeypatch.setattr(atomic, "atomic_write_bytes", full_disk)
    import amct_torch.caffe.netio as netio
    import amct_torch.export.caffe.text as caffe_text
    monkeypatch.setattr(netio, "atomic_write_bytes", full_disk, raising=False)
    monkeypatch.setattr(caffe_text, "atomic_write_bytes", full_disk, raising=False)
    with pytest.raises(AmctError, match="no space left") as err:
        amct_torch.quantize(model, weights, DATA, output=prefix, device="cpu", quiet=True,
                            report=False, batch_num=2)
    assert err.value.file == prefix + "_deploy_model.prototxt"
    assert {p: _bytes(p) for p in first.files.values()} == before
    assert sorted(os.listdir(tmp_path / "o")) == sorted(os.path.basename(p) for p in before)
