"""After a command the files under an output prefix are that run's whole set: a rerun removes
the earlier run's files it does not write (and says so), never an input and never a file that is
not a known output name; a staging folder with a damaged manifest does not stop the next run;
SIGTERM cleans the staging folder like Ctrl-C and exits with 143."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import amct_torch
from amct_torch.export.formats import prefix_outputs, prefix_suffixes
from amct_torch.files.transaction import MANIFEST, OutputTransaction, Terminated, recover, staging_folder
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model

DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES_WRITTEN_BY_ALL = ("_quant_config.json", "_record.txt", "_fake_quant_model.prototxt",
                           "_fake_quant_weights.caffemodel", "_deploy_model.prototxt",
                           "_deploy_weights.caffemodel", "_quant.json", "_layer_report.json", "_report.html",
                           "_float.onnx", "_quant.onnx")


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "amct_torch.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _calibrate_args(prefix: str, *extra: str) -> list[str]:
    model, weights = example_model()
    return ["calibrate", model, weights, DATA, "--device", "cpu", "-q", "--batch-num", "1",
            "-o", prefix, *extra]


def _names(folder) -> set[str]:
    return set(os.listdir(folder))


def test_every_name_a_run_writes_is_a_known_output_name(tmp_path):
    # the list the removal works from must hold every file a full run writes
    prefix = str(tmp_path / "m")
    res = amct_torch.quantize(*example_model(), DATA, output=prefix, device="cpu", quiet=True,
                              batch_num=1, onnx=True, report_batches=1)
    assert set(res.files.values()) <= {os.path.abspath(p) for p in prefix_outputs(prefix)}
    assert {os.path.basename(p) for p in prefix_outputs("m")} == {"m" + s for s in SUFFIXES_WRITTEN_BY_ALL}


@pytest.mark.slow
def test_rerun_removes_the_earlier_runs_files_it_does_not_write(tmp_path):
    out = tmp_path / "out"
    prefix = str(out / "m")
    first = _cli(*_calibrate_args(prefix, "--onnx", "--report-batches", "1"))
    assert first.returncode == 0, first.stderr
    assert _names(out) == {"m" + s for s in SUFFIXES_WRITTEN_BY_ALL}
    # files that are not outputs of this prefix: never touched
    (out / "notes.txt").write_text("mine")
    (out / "m_notes.txt").write_text("mine too")
    (out / "other_quant.onnx").write_text("another prefix")
    second = _cli(*_calibrate_args(prefix, "--save-type", "Fakequant", "--report-batches", "0"))
    assert second.returncode == 0, second.stderr
    kept = {"m_quant_config.json", "m_record.txt", "m_fake_quant_model.prototxt",
            "m_fake_quant_weights.caffemodel", "m_quant.json"}
    assert _names(out) == kept | {"notes.txt", "m_notes.txt", "other_quant.onnx"}
    gone = {"m_deploy_model.prototxt", "m_deploy_weights.caffemodel", "m_layer_report.json",
            "m_report.html", "m_float.onnx", "m_quant.onnx"}
    # the summary lists exactly what was removed
    listed = {os.path.basename(line.strip()) for line in second.stdout.split("removed", 1)[1].splitlines()[1:]
              if line.strip()}
    assert listed == gone


def test_the_api_result_lists_what_was_removed(tmp_path):
    model, weights = example_model()
    prefix = str(tmp_path / "m")
    amct_torch.quantize(model, weights, DATA, output=prefix, device="cpu", quiet=True,
                        batch_num=1, report_batches=1)
    os.makedirs(prefix + "_quant.onnx")  # a folder with an output's name is never removed
    res = amct_torch.quantize(model, weights, DATA, output=prefix, device="cpu", quiet=True,
                              batch_num=1, report=False, save_type="Fakequant")
    gone = ["m_deploy_model.prototxt", "m_deploy_weights.caffemodel", "m_layer_report.json", "m_report.html"]
    assert sorted(os.path.basename(p) for p in res.removed) == gone
    assert _names(tmp_path) == {os.path.basename(p) for p in res.files.values()} | {"m_quant.onnx"}
    assert os.path.isdir(prefix + "_quant.onnx")


def test_stale_removal_spares_the_inputs_of_the_run(tmp_path):
    prefix = str(tmp_path / "m")
    for p in prefix_outputs(prefix):
        with open(p, "w") as f:
            f.write("old")
    tx = OutputTransaction([prefix + "_record.txt"], inputs=[prefix + "_layer_report.json"],
                           owns_prefix=prefix, known_suffixes=prefix_suffixes()).begin("m")
    with open(tx.staged(prefix + "_record.txt"), "w") as f:
        f.write("new")
    published = tx.commit()
    assert list(published) == [os.path.abspath(prefix + "_record.txt")]
    assert _names(tmp_path) == {"m_record.txt", "m_layer_report.json"}
    assert sorted(published.removed) == sorted(
        os.path.abspath(p) for p in prefix_outputs(prefix)
        if not p.endswith(("_record.txt", "_layer_report.json")))
    assert open(prefix + "_record.txt").read() == "new"


def test_a_transaction_that_does_not_own_the_prefix_removes_nothing(tmp_path):
    prefix = str(tmp_path / "m")
    for p in prefix_outputs(prefix):
        with open(p, "w") as f:
            f.write("old")
    tx = OutputTransaction([prefix + "_quant.json"], name="m").begin()
    with open(tx.staged(prefix + "_quant.json"), "w") as f:
        f.write("new")
    assert tx.commit().removed == []
    assert _names(tmp_path) == {os.path.basename(p) for p in prefix_outputs(prefix)}


def test_a_kill_during_the_commit_is_finished_with_its_removals_only_of_known_names(tmp_path):
    prefix = str(tmp_path / "m")
    for name in ("m_quant.onnx", "m_float.onnx", "m_notes.txt", "keep.txt"):
        (tmp_path / name).write_text("old")
    staging = staging_folder(prefix)
    os.mkdir(staging)
    (tmp_path / ".m.amct-partial" / "m_record.txt").write_text("new")
    manifest = {"moves": ["m_record.txt"],
                "removes": ["m_quant.onnx", "m_float.onnx", "m_notes.txt", "keep.txt"]}
    (tmp_path / ".m.amct-partial" / MANIFEST).write_text(json.dumps(manifest))
    done = recover(staging, known_suffixes=prefix_suffixes())
    assert done == [os.path.join(str(tmp_path), "m_record.txt")]
    # m_notes.txt and keep.txt are no output names of prefix m: a manifest cannot remove them
    assert _names(tmp_path) == {"m_record.txt", "m_notes.txt", "keep.txt"}


DAMAGED = {
    "garbage": b"{garbage",
    "json_list": b"[1, 2, 3]",
    "moves_string": b'{"moves": "m_record.txt"}',
    "moves_numbers": b'{"moves": [1, 2]}',
    "moves_path": b'{"moves": ["../../escape.txt"]}',
    "moves_dotdot": b'{"moves": [".."]}',
    "removes_dict": b'{"moves": [], "removes": {"m_quant.onnx": 1}}',
    "no_moves": b'{"removes": []}',
    "binary": bytes(range(256)),
    "empty": b"",
    "not_utf8": b'{"moves": ["\xff\xfe"]}',
}


@pytest.mark.parametrize("kind", sorted(DAMAGED) + ["folder", "fifo"])
def test_a_damaged_manifest_does_not_stop_the_next_run(tmp_path, kind, caplog):
    # an in-process CLI run earlier in the session may have left the package logger at -q's level
    caplog.set_level(logging.WARNING, logger="amct_torch")
    prefix = str(tmp_path / "m")
    (tmp_path / "m_record.txt").write_text("previous run")
    (tmp_path / "escape.txt").write_text("outside")
    staging = staging_folder(prefix)
    os.mkdir(staging)
    (tmp_path / ".m.amct-partial" / "m_record.txt").write_text("staged")
    manifest = os.path.join(staging, MANIFEST)
    if kind == "folder":
        os.mkdir(manifest)
    elif kind == "fifo":
        os.mkfifo(manifest)
    else:
        with open(manifest, "wb") as f:
            f.write(DAMAGED[kind])
    tx = OutputTransaction([prefix + "_record.txt"], name="m").begin()  # no hang, no traceback
    with open(tx.staged(prefix + "_record.txt"), "w") as f:
        f.write("new")
    tx.commit()
    assert (tmp_path / "m_record.txt").read_text() == "new"
    assert (tmp_path / "escape.txt").read_text() == "outside"
    assert not os.path.exists(staging)
    assert "damaged" in caplog.text


def test_cli_rerun_after_a_damaged_manifest_is_clean(tmp_path):
    prefix = str(tmp_path / "out" / "m")
    os.makedirs(staging_folder(prefix))
    with open(os.path.join(staging_folder(prefix), MANIFEST), "w") as f:
        f.write("{garbage")
    res = _cli(*_calibrate_args(prefix, "--report-batches", "0"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert not os.path.exists(staging_folder(prefix))
    assert os.path.isfile(prefix + "_record.txt")


def test_sigterm_during_calibration_cleans_the_staging_folder_and_exits_143(tmp_path):
    model, weights = example_model()
    out = tmp_path / "out"
    out.mkdir()
    (out / "m_record.txt").write_text("the previous run")
    prefix = str(out / "m")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen([sys.executable, "-m", "amct_torch.cli", "calibrate", model, weights, DATA,
                             "--device", "cpu", "-q", "--batch-num", "180", "--batch-size", "1",
                             "--onnx", "-o", prefix], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    staging = staging_folder(prefix)
    t0 = time.time()
    while not os.path.exists(staging) and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before its staging folder was seen"
    proc.send_signal(signal.SIGTERM)  # at once: the run is loading the model or calibrating
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["amct-torch calibrate: terminated by signal 15; no output was written"]
    assert _names(out) == {"m_record.txt"}
    assert (out / "m_record.txt").read_text() == "the previous run"


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default for the test (an earlier test may have left a transaction open,
    as a live run would), restored after."""
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, old)

def _staged_new(tx: OutputTransaction, finals: list) -> OutputTransaction:
    """``tx`` begun, with "new" staged for each final path."""
    tx.begin("m")
    for p in finals:
        with open(tx.staged(p), "w") as f:
            f.write("new")
    return tx


def _sigterm_after_the_first_rename(monkeypatch) -> None:
    """A SIGTERM to this process arrives between the commit's first and second rename."""
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        if not calls:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        calls.append(dst)
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)



def test_sigterm_inside_the_commit_waits_for_the_whole_set(tmp_path, monkeypatch, default_sigterm):
    prefix = str(tmp_path / "m")
    finals = [prefix + "_record.txt", prefix + "_quant.json", prefix + "_quant_config.json"]
    tx = _staged_new(OutputTransaction(finals, owns_prefix=prefix, known_suffixes=prefix_suffixes()), finals)
    _sigterm_after_the_first_rename(monkeypatch)
    with pytest.raises(Terminated) as stop:
        tx.commit()
    assert stop.value.code == 143 and stop.value.committed
    assert all(open(p).read() == "new" for p in finals)
    assert not os.path.exists(staging_folder(prefix))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler gone with the transaction


def test_sigterm_handler_only_while_a_transaction_is_open_and_never_over_the_apps(tmp_path, default_sigterm):
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    tx = OutputTransaction([str(tmp_path / "m_record.txt")]).begin()
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    tx.abort()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def mine(signum, frame):
        pass
    old = signal.signal(signal.SIGTERM, mine)
    try:
        tx = OutputTransaction([str(tmp_path / "m_record.txt")]).begin()
        assert signal.getsignal(signal.SIGTERM) is mine
        tx.abort()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_during_an_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch, default_sigterm):
    from amct_torch.files.atomic import atomic_write_text
    target = tmp_path / "quant_config.json"
    target.write_text("before")
    real_fsync = os.fsync

    def fsync(fd):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(Terminated) as stop:
        atomic_write_text(str(target), "after")
    assert stop.value.code == 143
    assert _names(tmp_path) == {"quant_config.json"} and target.read_text() == "before"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_while_saving_a_checkpoint_leaves_no_temporary_file(tmp_path, monkeypatch, default_sigterm):
    from amct_torch.calibration import checkpoint
    from amct_torch.files.termination import clean_exit_on_signals

    def slow_save(state, path):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    monkeypatch.setattr(checkpoint, "checkpoint_state", lambda session: {})
    monkeypatch.setattr(checkpoint.torch, "save", slow_save)
    with pytest.raises(Terminated), clean_exit_on_signals():
        checkpoint.save_checkpoint(object(), str(tmp_path / "run.ckpt"))
    assert os.listdir(tmp_path) == []


def test_a_staging_folder_whose_lock_is_not_a_file_is_discarded(tmp_path):
    prefix = str(tmp_path / "m")
    staging = staging_folder(prefix)
    os.makedirs(os.path.join(staging, "lock"))
    tx = OutputTransaction([prefix + "_record.txt"], name="m").begin()
    tx.abort()
    assert os.listdir(tmp_path) == []


def test_a_staging_folder_that_cannot_be_removed_is_one_clear_error(tmp_path, monkeypatch):
    from amct_torch.errors import AmctError
    from amct_torch.files import transaction
    prefix = str(tmp_path / "m")
    staging = staging_folder(prefix)
    os.makedirs(os.path.join(staging, "work"))
    # what a folder the user cannot write in does to the removal (root would remove it anyway)
    monkeypatch.setattr(transaction.shutil, "rmtree", lambda path, ignore_errors=False: None)
    with pytest.raises(AmctError, match="delete it") as err:
        OutputTransaction([prefix + "_record.txt"], name="m").begin()
    assert err.value.file == staging


def test_a_leftover_handler_still_holds_the_signal_through_a_commit(tmp_path, monkeypatch, default_sigterm):
    # a transaction left open (its handler installed) and a second one committing: the set of
    # the second is whole whichever handler receives the signal
    OutputTransaction([str(tmp_path / "a" / "x_record.txt")]).begin()
    prefix = str(tmp_path / "m")
    finals = [prefix + "_record.txt", prefix + "_quant.json"]
    tx = _staged_new(OutputTransaction(finals), finals)
    _sigterm_after_the_first_rename(monkeypatch)
    with pytest.raises(Terminated) as stop:
        tx.commit()
    assert stop.value.committed and all(open(p).read() == "new" for p in finals)


def test_a_signal_between_begin_and_the_callers_cleanup_leaves_nothing(tmp_path, monkeypatch, capsys):
    # the job opens the transaction, then sets up its progress display before its try/finally:
    # a SIGTERM landing there ended the command with the staging folder left behind
    import amct_torch.runtime as runtime
    from amct_torch.cli import main
    from amct_torch.runtime import progress

    def terminated(*_args, **_kwargs):
        raise Terminated(15)
    monkeypatch.setattr(progress, "JobProgress", terminated)
    # the job reads it through the package's front door, which keeps a name once read
    monkeypatch.setattr(runtime, "JobProgress", terminated, raising=False)
    model, weights = example_model()
    prefix = str(tmp_path / "out" / "m")
    code = main(["calibrate", model, weights, DATA, "--device", "cpu", "-q", "-o", prefix])
    assert code == 143
    assert capsys.readouterr().err.strip() == "amct-torch calibrate: terminated by signal 15; no output was written"
    assert os.listdir(tmp_path) == []  # neither the staging folder nor the folder it made
