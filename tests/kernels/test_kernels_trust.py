"""The compiled kernels are loaded only when they can be trusted, and take only checked input.

A shared library runs its code in the user's process, so the cache it comes from is
untrusted: libraries planted by someone else, a world-writable cache, a corrupted file or a
build that fails its self-check must never run; and a tensor of the wrong length from a
checkpoint must be an error at the Python boundary, never a write past a buffer in C.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from amct_torch.calibration.observers import HfmgObserver, IfmrStreamingObserver
from amct_torch.errors import CalibrationError
from amct_torch.kernels import build as native_build
from amct_torch.kernels import native

CC = native_build.find_compiler()
needs_cc = pytest.mark.compiler

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char* p = getenv("AMCT_PLANTED_MARKER");
    if (p) { FILE* f = fopen(p, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
"""


def _plant(folder, tmp_path, owner_other: bool) -> list:
    """A library that writes a marker when loaded, under every name the cache uses, with a
    digest record that matches it (so only ownership/permissions can refuse it)."""
    src = tmp_path / "planted.c"
    src.write_text(PLANTED)
    lib = tmp_path / "planted.so"
    subprocess.run([*CC.split(), "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    names = {native_build.library_name(CC, native_build.FLAGS + ["-fopenmp"]),
             native_build.library_name(CC, native_build.FLAGS)}
    planted = []
    for name in names:
        target = folder / name
        shutil.copy(lib, target)
        target.with_suffix(".sha256").write_text(native_build._digest(target) + "\n")
        for p in (target, target.with_suffix(".sha256")):
            if owner_other and os.getuid() == 0:
                os.chown(p, 65534, 65534)
            else:
                os.chmod(p, 0o666)                      # writable by others: refused as well
        planted.append(target)
    return planted


def _fresh_library(m, cache, tmp_path):
    m.setattr(native, "_state", {})
    m.setattr(native_build, "_warned", set())
    m.setenv("AMCT_TORCH_CACHE", str(cache))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    m.setattr(native_build.tempfile, "tempdir", str(tmp_path / "tmp"))
    return native.library()


@needs_cc
@pytest.mark.parametrize("layout", ["world_writable_cache", "foreign_files_in_private_cache"])
def test_planted_library_never_runs(layout, monkeypatch, tmp_path, caplog):
    marker = tmp_path / "marker"
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    if layout == "world_writable_cache":
        cache.chmod(0o777)
    planted = {native_build._digest(p) for p in _plant(cache, tmp_path, owner_other=True)}
    monkeypatch.setenv("AMCT_PLANTED_MARKER", str(marker))
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="amct_torch"):
        lib = _fresh_library(m, cache, tmp_path)
        assert lib is not None, native.unavailable_reason()
        assert not marker.exists(), "a planted library ran"
        loaded = lib._amct_path
        assert native_build._digest(loaded) not in planted and native_build.verified(loaded)
        assert stat.S_IMODE(os.stat(loaded.parent).st_mode) & 0o077 == 0
        if layout == "world_writable_cache":
            assert loaded.parent != cache                 # built in a private folder instead
            assert any("not private" in r.message for r in caplog.records)
    native.library()                                      # restore the normal library for later tests


@needs_cc
def test_corrupted_library_is_rebuilt_not_loaded(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        lib = _fresh_library(m, cache, tmp_path)
        path = lib._amct_path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF                      # one flipped byte: digest mismatch
        corrupt = path.with_name("corrupt.tmp")           # (a new file: the loaded one stays mapped)
        corrupt.write_bytes(bytes(data))
        corrupt.chmod(0o700)
        os.replace(corrupt, path)
        assert not native_build.verified(path)
        lib2 = _fresh_library(m, cache, tmp_path)
        assert lib2 is not None and native_build.verified(lib2._amct_path)


@needs_cc
def test_library_failing_its_self_check_is_deleted(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        m.setattr(native, "self_check", lambda: "differs on purpose")
        assert _fresh_library(m, cache, tmp_path) is None
        assert "self-check failed" in native.unavailable_reason()
        assert not list(cache.glob("*.so"))               # never reused


@needs_cc
def test_cache_folder_is_created_private(monkeypatch, tmp_path):
    cache = tmp_path / "new" / "cache"
    with monkeypatch.context() as m:
        old = os.umask(0o002)
        try:
            assert _fresh_library(m, cache, tmp_path) is not None
        finally:
            os.umask(old)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


@needs_cc
def test_compiler_given_as_a_command_line_works(monkeypatch, tmp_path):
    """CC="ccache gcc" (a wrapper program and the compiler): here a wrapper that runs its
    arguments, as ccache does, and ccache itself where it is installed."""
    wrapper = tmp_path / "wrapcc"
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')
    wrapper.chmod(0o755)
    commands = [f"{wrapper} {CC}"] + ([f"ccache {CC}"] if shutil.which("ccache") else [])
    for i, cc in enumerate(commands):
        with monkeypatch.context() as m:
            m.setenv("CC", cc)
            m.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
            lib = _fresh_library(m, tmp_path / f"cache{i}", tmp_path)
            assert lib is not None, native.unavailable_reason()


@needs_cc
def test_cache_key_names_the_compiler_version(monkeypatch):
    a = native_build.library_name(CC, native_build.FLAGS)
    monkeypatch.setattr(native_build, "compiler_identity", lambda cc, deadline=None: "gcc (Other) 99.1")
    assert native_build.library_name(CC, native_build.FLAGS) != a


def test_wrong_length_state_is_refused_before_any_kernel(device):
    """A checkpoint state whose buffers have the wrong length (1 value instead of 1024) is a
    CalibrationError naming the layer — it never reaches compiled code."""
    good = IfmrStreamingObserver("conv2")
    good.update(torch.randn(20_000, device=device))
    state = dict(good.state_dict())
    for key, bad in [("bottom", state["bottom"][:1]), ("top", state["top"][:7]),
                     ("counts", state["counts"][:100]), ("dsum", state["dsum"][:3]),
                     ("count", torch.tensor(10 ** 12)), ("count", torch.tensor(-5)),
                     ("frame", torch.tensor([1, 2, 3])), ("range", torch.tensor([math.nan, 1.0]))]:
        obs = IfmrStreamingObserver("conv2")
        with pytest.raises(CalibrationError, match="conv2"):
            obs.load_state_dict({**state, key: bad})
    h = HfmgObserver("fc1", 512)
    with pytest.raises(CalibrationError, match="fc1"):
        h.load_state_dict({"counts": torch.ones(7, dtype=torch.int64), "range": torch.tensor([0.0, 1.0])})
    with pytest.raises(CalibrationError, match="fc1"):
        h.load_state_dict({"counts": -torch.ones(512, dtype=torch.int64), "range": torch.tensor([0.0, 1.0])})


@needs_cc
def test_kernel_wrappers_check_lengths_at_the_boundary():
    x = torch.randn(5000)
    k, nbins = 1024, 4096
    good = dict(top=torch.full((k,), -math.inf), bottom=torch.full((k,), math.inf),
                counts=torch.zeros(nbins + 1, dtype=torch.int64), dsum=torch.zeros(nbins + 1, dtype=torch.float64))
    for key, bad in [("bottom", torch.full((1,), math.inf)), ("counts", torch.zeros(10, dtype=torch.int64)),
                     ("dsum", torch.zeros(nbins + 1, dtype=torch.float32))]:
        c = native.Commit(-5.0, 5.0, -10, nbins, 21, -100, **{**good, key: bad}, insert_max=1 << 15)
        with pytest.raises(ValueError, match="stream_update"):
            native.stream_update(x, 1024.0, -5120.0, nbins + 1, 40, -math.inf, math.inf, k * 32, 1 << 23, 1, c)
    with pytest.raises(ValueError, match="hfmg_losses"):
        cnt = torch.zeros(9, dtype=torch.int64)
        native.hfmg_losses(torch.zeros(3, 9, dtype=torch.int64), cnt, torch.tensor([0]), torch.tensor([50]),
                           0.1, 1e-7)


@pytest.mark.parametrize("env,rc,says", [({}, 0, "ready"), ({"AMCT_TORCH_NATIVE": "0"}, 0, "turned off"),
                                         ({"CC": "/no/such/compiler"}, 1, "was not found")])
def test_build_kernels_command(env, rc, says, tmp_path):
    """`amct-torch build-kernels` builds into the cache and says so, or says why not."""
    import sys
    if "CC" not in env and "AMCT_TORCH_NATIVE" not in env and CC is None:
        pytest.skip("needs a C compiler (cc, gcc, clang or $CC) to build the CPU kernels")
    full = dict(os.environ, AMCT_TORCH_CACHE=str(tmp_path / "cache"), **env)
    res = subprocess.run([sys.executable, "-m", "amct_torch.cli", "build-kernels"], env=full,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == rc and says in res.stdout, (res.stdout, res.stderr)
    if says == "ready":
        built = res.stdout.split("ready:")[1].strip()
        assert os.path.exists(built) and native_build.verified(Path(built))
