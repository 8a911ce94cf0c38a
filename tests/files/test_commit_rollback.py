"""A commit that fails half-way leaves the complete earlier set: each earlier file is
hard-linked first (which proves each can be replaced) and put back on any failure; the one-line
error names the user's output, says why in plain words and that the earlier outputs were kept;
a kill before the commit point leaves the earlier set in place."""
from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from amct_torch.errors import AmctError
from amct_torch.export.formats import prefix_suffixes
from amct_torch.files.transaction import ASIDE, OutputTransaction, recover, staging_folder


def _old_set(prefix: str, suffixes=("_record.txt", "_quant.json", "_quant_config.json")) -> list:
    finals = [prefix + s for s in suffixes]
    for p in finals:
        with open(p, "w") as f:
            f.write("old")
    return finals


def _staged_new(finals: list, owns: str = None) -> OutputTransaction:
    tx = OutputTransaction(finals, owns_prefix=owns, known_suffixes=prefix_suffixes()).begin("m")
    for p in finals:
        with open(tx.staged(p), "w") as f:
            f.write("new")
    return tx


def _contents(paths) -> list:
    return [open(p).read() for p in paths]


def _fail_on_call(monkeypatch, name: str, n: int, code: int = errno.EIO) -> None:
    """``os.<name>`` fails (``code``) on its ``n``-th call: an honest fault injection."""
    real = getattr(os, name)
    calls = []

    def failing(src, dst, *a, **k):
        calls.append(dst)
        if len(calls) == n:
            raise OSError(code, os.strerror(code), dst)
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, name, failing)


@pytest.mark.parametrize("call, n", [("link", 1), ("link", 3), ("replace", 1), ("replace", 2),
                                     ("replace", 3), ("replace", 4)])
def test_a_rename_failing_amid_the_commit_keeps_the_whole_earlier_set(tmp_path, monkeypatch, call, n):
    # link: keeping each earlier file; replace: the manifest (1st), then the new files
    prefix = str(tmp_path / "m")
    finals = _old_set(prefix)
    tx = _staged_new(finals)
    _fail_on_call(monkeypatch, call, n, errno.EPERM)
    with pytest.raises(AmctError) as err:
        tx.commit()
    monkeypatch.undo()
    tx.abort()
    msg = str(err.value)
    assert "the previous outputs were kept" in msg and "not permitted" in msg
    assert ".amct-partial" not in msg and ".tmp" not in msg
    assert _contents(finals) == ["old"] * 3
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in finals)


def test_a_failed_commit_keeps_the_stale_files_of_an_owned_prefix_too(tmp_path, monkeypatch):
    prefix = str(tmp_path / "m")
    finals = _old_set(prefix)
    stale = _old_set(prefix, ("_deploy_model.prototxt",))
    tx = _staged_new(finals, owns=prefix)
    _fail_on_call(monkeypatch, "replace", 3)
    with pytest.raises(AmctError, match="previous outputs were kept"):
        tx.commit()
    monkeypatch.undo()
    tx.abort()
    assert _contents(finals + stale) == ["old"] * 4


def test_a_failed_removal_of_a_stale_file_puts_back_the_ones_already_removed(tmp_path, monkeypatch):
    prefix = str(tmp_path / "m")
    finals = _old_set(prefix)
    stale = _old_set(prefix, ("_deploy_model.prototxt", "_deploy_weights.caffemodel"))
    tx = _staged_new(finals, owns=prefix)
    real_unlink, calls = os.unlink, []

    def unlink(path, *a, **k):  # the second stale file cannot be removed
        if os.path.dirname(str(path)) == str(tmp_path):
            calls.append(path)
            if len(calls) == 2:
                raise OSError(errno.EPERM, os.strerror(errno.EPERM), path)
        return real_unlink(path, *a, **k)
    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(AmctError, match="previous outputs were kept"):
        tx.commit()
    monkeypatch.undo()
    tx.abort()
    assert len(calls) == 2
    assert _contents(finals + stale) == ["old"] * 5
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in finals + stale)


def test_an_immutable_earlier_output_keeps_the_earlier_set(tmp_path, monkeypatch):
    prefix = str(tmp_path / "m")
    finals = _old_set(prefix)
    locked = finals[1]
    immutable = subprocess.run(["chattr", "+i", locked], capture_output=True).returncode == 0 \
        if shutil.which("chattr") else False
    if not immutable:  # a filesystem without the flag: the kernel's refusal of it, injected
        real = os.link

        def link(src, dst, *a, **k):
            if os.fspath(src) == locked:
                raise OSError(errno.EPERM, os.strerror(errno.EPERM), src)
            return real(src, dst, *a, **k)
        monkeypatch.setattr(os, "link", link)
    try:
        tx = _staged_new(finals)
        with pytest.raises(AmctError) as err:
            tx.commit()
        tx.abort()
        assert str(err.value).startswith(locked + ": ")
        assert "previous outputs were kept" in str(err.value)
        assert _contents(finals) == ["old"] * 3
        assert not os.path.exists(staging_folder(prefix))
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", locked], check=True)


def test_a_kill_before_the_commit_point_leaves_the_earlier_set_in_place(tmp_path):
    # a dead run's staging folder without a manifest, its links to the earlier files made:
    # the folder already holds the whole earlier set, and the next run only discards the rest
    prefix = str(tmp_path / "m")
    finals = _old_set(prefix)
    staging = staging_folder(prefix)
    os.makedirs(os.path.join(staging, ASIDE))
    for p in finals[:2]:
        os.link(p, os.path.join(staging, ASIDE, os.path.basename(p)))
    assert _contents(finals) == ["old"] * 3
    assert recover(staging) == []
    assert _contents(finals) == ["old"] * 3 and not os.path.exists(staging)


def test_another_users_earlier_output_in_a_sticky_folder_keeps_the_set():
    # a /tmp-like folder (sticky, world-writable) where the earlier outputs belong to root and
    # this run is another user's: the kernel refuses to rename root's files, so the commit must
    # fail whole and say so
    if os.geteuid() != 0:
        pytest.skip("needs root to own files as two users")  # the injected tests above cover it
    top = tempfile.mkdtemp(prefix="amct_sticky_")  # (pytest's own folder is closed to others)
    try:
        _sticky_commit(pathlib.Path(top))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_another_users_earlier_output_in_a_sticky_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    # the same folder seen by a process of another user (its id faked): begin() refuses the
    # earlier output it could not replace, naming it, before the staging folder exists
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    prefix = str(shared / "m")
    finals = _old_set(prefix)
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    with pytest.raises(AmctError) as err:
        OutputTransaction(finals[:1], known_suffixes=prefix_suffixes()).begin("m")
    assert str(err.value).startswith(finals[0] + ": ") and "previous outputs were kept" in str(err.value)
    # an owned prefix's other earlier outputs (removed by a commit) are refused too
    with pytest.raises(AmctError) as err:
        OutputTransaction([prefix + "_report.html"], owns_prefix=prefix, known_suffixes=prefix_suffixes()).begin("m")
    assert str(err.value).startswith(prefix + "_")
    assert _contents(finals) == ["old"] * 3
    assert sorted(os.listdir(shared)) == sorted(os.path.basename(p) for p in finals)


def _sticky_commit(top) -> None:
    os.chmod(top, 0o755)
    shared = top / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    prefix = str(shared / "m")
    finals = [prefix + s for s in ("_record.txt", "_quant.json", "_quant_config.json")]
    os.seteuid(65534)  # this process is "nobody" for the run
    try:
        tx = _staged_new(finals)  # begun before root's earlier files appear (else begin() refuses them)
    finally:
        os.seteuid(0)
    assert _old_set(prefix) == finals
    for p in finals:
        os.chmod(p, 0o666)
    os.seteuid(65534)  # the files stay root's
    try:
        with pytest.raises(AmctError) as err:
            tx.commit()
        tx.abort()
    finally:
        os.seteuid(0)
    msg = str(err.value)
    assert msg.startswith(finals[0] + ": ") and "previous outputs were kept" in msg
    assert _contents(finals) == ["old"] * 3
    assert sorted(os.listdir(shared)) == sorted(os.path.basename(p) for p in finals)
