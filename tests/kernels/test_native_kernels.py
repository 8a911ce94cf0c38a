"""The compiled CPU histogram kernels (amct_torch/kernels: native.py, ops.py, hist_kernels.c).

They must compute the same integers as the torch formulas — checked here against plain
numpy float32 references — and an observer's state must not depend on whether the kernels
are present, on how many threads run them, or on which update path (fused or general) a batch
took.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from amct_torch import kernels
from amct_torch.algorithms import hfmg, histogram, streaming
from amct_torch.calibration import backends
from amct_torch.calibration.observers import HfmgObserver, IfmrStreamingObserver
from amct_torch.errors import CalibrationError
from amct_torch.kernels import build as native_build
from amct_torch.kernels import native

#: torch ops; the kernels at their widest vector width; the kernels' 4-lane code where the
#: CPU has a wider one (both widths must give the same integers)
BACKENDS = ["torch"] + (["native"] if native.library() is not None else []) \
    + (["native_4_lanes"] if native.library() is not None and native.set_isa(-1) else [])


def use_backend(m, kernels_on: bool) -> None:
    """Choose the observers' CPU backend for the rest of the monkeypatch context ``m``."""
    torch_backend = backends.TorchBackend()
    m.setitem(backends._chosen, "cpu", (kernels.backend(torch_backend) if kernels_on else None) or torch_backend)


def accumulate(backend: str, x, e, base, counts, dsum, threads: int = 2) -> None:
    """histogram.accumulate through the kernels (``native`` backends) or the torch formula."""
    if backend == "torch":
        histogram.accumulate(x, e, base, counts, dsum)
        return
    r = native.stream_update(x, math.ldexp(1.0, -e), float(base), counts.numel(), histogram.OFFSET_BITS,
                             math.inf, -math.inf, 0, histogram.MAX_SLICE, threads)
    assert not r.outside
    native.add_packed(r.acc, counts, dsum, histogram.OFFSET_BITS)


@pytest.fixture
def backend(request, monkeypatch):
    use_backend(monkeypatch, request.param != "torch")
    if request.param == "native_4_lanes":
        native.set_isa(0)
        yield request.param
        native.set_isa(-1)
        return
    yield request.param


def data(kind: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    if kind == "relu":
        return torch.relu(x + 0.2) * 3
    if kind == "edges":              # many values exactly on power-of-two bin edges, and zeros
        x = torch.round(x * 256) / 256
        x[::5] = 0.0
        return x
    if kind == "shifted":            # a range away from zero: base ≠ 0
        return x * 0.01 + 7.5
    if kind == "heavy":
        return x / torch.rand(n, generator=g).clamp_min(0.02)
    if kind == "zero_runs":          # whole blocks of zeros, blocks without one, mixed ones
        x = torch.relu(x)
        for start in range(0, n, 3000):
            x[start:start + 1500] = 0.0
            x[start + 1500:start + 2600] = x[start + 1500:start + 2600].abs() + 0.01
        return x
    return x


def numpy_packed(x: np.ndarray, e: int, base: int, slots: int):
    """Counts and offset sums (2^-16 bin units) straight from the definition, float32 maths."""
    u = x.astype(np.float32) * np.float32(math.ldexp(1.0, -e))
    u = (u - np.float32(base)).astype(np.float32)
    j = np.trunc(u).astype(np.int64)
    f = (u - j.astype(np.float32)).astype(np.float32)
    q = np.trunc((f * np.float32(65536.0)).astype(np.float32) + np.float32(0.5)).astype(np.int64)
    return np.bincount(j, minlength=slots), np.bincount(j, weights=q, minlength=slots)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_full_slices_of_the_largest_offsets_do_not_overflow(backend):
    """The packed fields at their limit: slices of MAX_SLICE values, all in two bins, half
    of them at the largest offset q = 65536 (one float32 step below a bin edge), half at
    49152."""
    n = histogram.MAX_SLICE + 3                       # on one thread: a full slice and a few more
    e, base = -12, 0                                  # bins of 2^-12 from 0
    x = torch.full((n,), float(np.nextafter(np.float32(2.0 ** -11), np.float32(0.0))))   # bin 1's top
    x[1::2] = 0.5 - 2.0 ** -14                        # a quarter bin below 0.5's edge
    counts = torch.zeros(4097, dtype=torch.int64)
    dsum = torch.zeros(4097, dtype=torch.float64)
    accumulate(backend, x, e, base, counts, dsum, threads=1)
    want_c, want_q = numpy_packed(x.numpy(), e, base, 4097)
    assert want_q.max() >= 65536 * (n // 2)           # the largest offset, n/2 times
    assert counts.tolist() == want_c.tolist()
    assert torch.equal(dsum, torch.from_numpy(want_q) * 2.0 ** -16)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("kind", ["normal", "relu", "edges", "shifted", "heavy"])
def test_packed_histogram_matches_numpy_reference(backend, kind, monkeypatch):
    monkeypatch.setattr(native, "MIN_PER_THREAD", 1000)      # several slices on two threads
    x = data(kind, 30011, seed=len(kind))
    e, base = reference_frame(float(x.min()), float(x.max()), 4096)
    counts = torch.zeros(4097, dtype=torch.int64)
    dsum = torch.zeros(4097, dtype=torch.float64)
    accumulate(backend, x, e, base, counts, dsum)
    want_c, want_q = numpy_packed(x.numpy(), e, base, 4097)
    assert counts.tolist() == want_c.tolist()
    assert torch.equal(dsum, torch.from_numpy(want_q) * 2.0 ** -16)
    # the offsets are the elements' positions inside their bins, to 2^-17 of a bin each
    w = math.ldexp(1.0, e)
    centre = (torch.arange(4097, dtype=torch.float64) + base) * w
    rebuilt = (counts.double() * centre + dsum * w).sum()
    assert float(rebuilt) == pytest.approx(float(x.double().sum()), abs=x.numel() * w * 2.0 ** -16 + 1e-9)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("kind,n", [("normal", 20000), ("relu", 20000), ("relu", 20003), ("edges", 20000),
                                    ("shifted", 20000), ("zero_runs", 30007)])
def test_hfmg_histogram_matches_numpy_reference(backend, kind, n):
    x = data(kind, n, seed=3)
    mn, mx = float(x.min()), float(x.max())
    w = np.float32(hfmg.bin_width(mn, mx, 1024))
    t = ((x.numpy() - np.float32(mn)).astype(np.float32) / w).astype(np.float32)
    want = np.bincount(np.minimum(np.trunc(t).astype(np.int64), 1023), minlength=1024)
    got = hfmg.histogram(x, mn, mx, 1024) if backend == "torch" else \
        native.hfmg_pass(x, mn, mx, hfmg.bin_width(mn, mx, 1024), 1024, threads=2).counts
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("threads", [1, 2])
def test_hfmg_widening_batch_reports_every_slices_extremes(backend, threads, monkeypatch):
    """A value outside the range in the first slice stops the binning of every slice; the
    extremes and NaNs of the slices that stop on that signal (in their first block, with one
    thread: they run after it) must still be found — in the pass itself and in the state the
    observer then builds (HFMG's sequential rule, the plain reference of test_algo_hfmg)."""
    monkeypatch.setattr(native, "HFMG_MAX_SLICE", 9000)
    monkeypatch.setattr(native, "MIN_PER_THREAD", 1000)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)                        # the observer passes torch's count on
    try:
        _widening_case(backend, threads)
    finally:
        torch.set_num_threads(before)


def _widening_case(backend, threads):
    from helpers.hfmg_reference import ref_hist, ref_redistribute
    g = torch.Generator().manual_seed(5)
    first = torch.rand(40_000, generator=g) * 2 - 1
    first[0], first[1] = -1.0, 1.0
    x = torch.rand(40_000, generator=g) * 2 - 1
    x[10] = 1.5                                           # outside, in the first slice
    x[35_000], x[29_999] = 9.0, -7.0                      # the extremes, in later slices
    if backend != "torch":
        r = native.hfmg_pass(x, -1.0, 1.0, hfmg.bin_width(-1.0, 1.0, 256), 256, threads)
        assert r.outside and (r.lo, r.hi) == (-7.0, 9.0) and r.nans == 0
    obs = HfmgObserver("conv7", 256)
    obs.update(first)
    obs.update(x)
    want = ref_redistribute(ref_hist(first.numpy(), -1.0, 1.0, 256), -1.0, 1.0, -7.0, 9.0) \
        + ref_hist(x.numpy(), -7.0, 9.0, 256)
    assert (obs.mn, obs.mx) == (-7.0, 9.0) and obs.counts.tolist() == want.tolist()
    x[39_000] = float("nan")
    if backend != "torch":
        r = native.hfmg_pass(x, -1.0, 1.0, hfmg.bin_width(-1.0, 1.0, 256), 256, threads)
        assert r.outside and (r.lo, r.hi) == (-7.0, 9.0) and r.nans == 1
    obs.update(x)
    with pytest.raises(CalibrationError, match="conv7"):
        obs.compute()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_hfmg_constant_batches_after_a_constant_first(backend):
    """A constant state and a constant batch keep the range empty (mn == mx): the batch must go
    to the middle bin, not through a zero bin width (which the pass refuses: garbage indices
    would scatter out of bounds)."""
    obs = HfmgObserver("pool1", 256)
    obs.update(torch.full((100,), 1.5))
    obs.update(torch.full((300,), 1.5))
    assert (obs.mn, obs.mx) == (1.5, 1.5) and obs.counts[128] == 400 and int(obs.counts.sum()) == 400
    if backend != "torch":
        with pytest.raises(ValueError, match="positive bin width"):
            native.hfmg_pass(torch.full((100,), 1.5), 1.5, 1.5, 0.0, 256)


def test_redistribute_kernel_gives_the_torch_formulas_integers():
    """The compiled redistribute (where a C compiler built it) and the torch formulas against
    the plain loop of test_algo_hfmg, on ranges that grow on one side, both sides, by whole old
    bins (splits exactly on edges), by a factor that puts many old bins into one, and on huge
    counts."""
    from helpers.hfmg_reference import ref_redistribute
    impls = [hfmg.redistribute] + ([native.hfmg_redistribute] if native.library() is not None else [])
    rng = np.random.default_rng(11)
    cases = [(-1.0, 1.0, -1.0, 3.0), (-1.0, 1.0, -2.0, 1.0), (0.0, 2.0, -0.5, 2.5),
             (0.0, 1.0, 0.0, 1000.0), (0.25, 0.75, -3.0, 0.75)]
    cases += [tuple(sorted(rng.uniform(-2, 2, 2))) for _ in range(6)]
    for i, case in enumerate(cases):
        omn, omx = case[:2]
        nmn, nmx = case[2:] if len(case) == 4 else (omn - rng.uniform(0, 3), omx + rng.uniform(0, 3))
        hi = 2 ** 40 if i % 3 == 0 else 60
        counts = torch.from_numpy(rng.integers(0, hi, 1000 + 24 * i))
        want = ref_redistribute(counts.numpy(), omn, omx, nmn, nmx)
        for impl in impls:
            assert np.array_equal(impl(counts, omn, omx, nmn, nmx).numpy(), want), (impl.__name__, case)


def batches(seed: int):
    """Batches whose range grows, shrinks back and jumps (every update path gets taken)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, scale in enumerate([1.0, 1.0, 3.0, 1.0, 1.0, 0.5, 8.0, 1.0, 1.0, 1.0]):
        n = [300_000, 70_000, 5_000, 1][i % 4] if i else 300_000
        x = torch.randn(n, generator=g) * scale
        out.append(torch.relu(x) if seed % 2 else x)
    return out


def states(obs_factory, backend_usable: bool, seed: int, monkeypatch, threads: int = 2):
    with monkeypatch.context() as m:
        use_backend(m, backend_usable)
        m.setattr(native, "MIN_PER_THREAD", 20_000)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            obs = obs_factory()
            for x in batches(seed):
                obs.update(x)
        finally:
            torch.set_num_threads(before)
    return obs


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("factory", [lambda: IfmrStreamingObserver("l"), lambda: HfmgObserver("l", 2048)],
                         ids=["ifmr_streaming", "hfmg"])
def test_observer_state_is_the_same_with_or_without_the_kernels(factory, seed, monkeypatch):
    # (without a compiler both runs take the torch path: thread count independence remains)
    a = states(factory, True, seed, monkeypatch)
    b = states(factory, False, seed, monkeypatch)
    c = states(factory, True, seed, monkeypatch, threads=1)
    others = [b, c]
    if "native_4_lanes" in BACKENDS:
        native.set_isa(0)
        try:
            others.append(states(factory, True, seed, monkeypatch))
        finally:
            native.set_isa(-1)
    for other in others:
        sa, so = a.state_dict(), other.state_dict()
        assert sa.keys() == so.keys()
        for k in sa:
            assert torch.equal(sa[k], so[k]), k
        assert a.compute() == other.compute()


def test_steady_batches_take_the_fused_path(monkeypatch):
    calls = {"fused": 0, "general": 0}
    real_update, real_acc = native.stream_update, streaming.update
    monkeypatch.setattr(native, "stream_update", lambda *a: calls.__setitem__("fused", calls["fused"] + 1) or real_update(*a))
    monkeypatch.setattr(streaming, "update", lambda *a, **k: calls.__setitem__("general", calls["general"] + 1) or real_acc(*a, **k))
    g = torch.Generator().manual_seed(5)
    obs = IfmrStreamingObserver("l")
    for _ in range(6):
        obs.update(torch.relu(torch.randn(8, 64, 28, 28, generator=g)).clamp(max=4.0))
    if "native" in BACKENDS:
        assert calls["general"] == 0      # even the first batch: chunk bounds keep candidates few
        assert calls["fused"] >= 6
    else:
        assert calls == {"fused": 0, "general": 6}


def reference_frame(gmin: float, gmax: float, nbins: int):
    """The frame rule written plainly: the smallest e at or above the magnitude floor
    (|x|/2^e < 2^22) and the bin-width floor whose grid holds [gmin, gmax] in nbins bins."""
    maxabs = max(abs(gmin), abs(gmax))
    e = histogram.MIN_EXP if maxabs == 0 else max(histogram.MIN_EXP, math.frexp(maxabs)[1] - 1 - histogram.REL_BITS)
    if gmax > gmin:
        e = max(e, math.frexp((gmax - gmin) / nbins)[1] - 1)
    while math.floor(math.ldexp(gmax, -e)) - math.floor(math.ldexp(gmin, -e)) > nbins - 1:
        e += 1
    return e, math.floor(math.ldexp(gmin, -e))


def test_tensor_frame_rule_is_the_plain_rule():
    """histogram.frame_of (fixed-shape tensor ops, what the observers run on any device)
    against the plain loop, over magnitudes from 1e-30 to 1e30, zero, tiny spans and floors."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        lo, hi = sorted(float(np.float32(v)) for v in rng.standard_normal(2) * 10.0 ** rng.integers(-30, 30))
        if rng.random() < 0.1:
            lo = 0.0 if rng.random() < 0.5 else -hi
        if rng.random() < 0.05:
            hi = lo
        nbins = int(rng.choice([7, 16, 1024, 16384]))
        e, base = reference_frame(lo, hi, nbins)
        floor = e + int(rng.integers(-3, 3))
        want = (e, base) if floor <= e else (floor, math.floor(math.ldexp(lo, -floor)))
        got = histogram.frame_of(torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64),
                                 nbins, torch.tensor(floor))
        assert (int(got[0]), int(got[1])) == want, (lo, hi, nbins, floor)


@pytest.mark.compiler
def test_frame_of_a_committing_update_is_the_python_frame():
    """A steady update commits in C only if its grown range keeps the frame; the C frame rule
    must be the frame rule (with the frame exponent as floor) exactly — and so must the
    tensor version the observers use (histogram.frame_of, through frame_for)."""
    rng = np.random.default_rng(4)
    for _ in range(3000):
        lo, hi = sorted(float(np.float32(v)) for v in rng.standard_normal(2) * 10.0 ** rng.integers(-30, 30))
        if rng.random() < 0.1:
            lo = 0.0 if rng.random() < 0.5 else -hi
        nbins = int(rng.choice([16, 1024, 16384]))
        e, base = reference_frame(lo, hi, nbins)
        floor = e + int(rng.integers(-2, 3))
        want = (e, base) if floor <= e else (floor, math.floor(math.ldexp(lo, -floor)))
        assert histogram.frame_for(lo, hi, nbins, floor) == want, (lo, hi, nbins, floor)
        assert native.frame_for(lo, hi, nbins, histogram.REL_BITS, histogram.MIN_EXP, floor) == want, \
            (lo, hi, nbins, floor)


@pytest.mark.compiler
@pytest.mark.parametrize("largest", [True, False])
def test_merging_candidates_into_the_extremes_is_topk(largest):
    g = torch.Generator().manual_seed(int(largest))
    for k, c in [(1024, 3), (1024, 9), (1024, 700), (1024, 5000), (16, 40), (1, 5)]:
        base = torch.round(torch.randn(4000, generator=g) * 8) / 8          # many ties
        buf = torch.topk(base, k, largest=largest).values.contiguous()
        cand = torch.round(torch.randn(c, generator=g) * 10) / 8
        cand = cand[cand > buf[-1]] if largest else cand[cand < buf[-1]]
        want = torch.topk(torch.cat([buf, cand]), k, largest=largest).values
        native.insert_extremes(buf, cand.contiguous(), largest)
        assert torch.equal(buf, want), (k, c)
    # magnitudes from subnormal to 1e38 of both signs: every byte of the float bits differs
    # between values (the large merges sort on those bits)
    spread = lambda n: (torch.randn(n, generator=g, dtype=torch.float64)
                        * 10.0 ** torch.randint(-44, 38, (n,), generator=g)).float()
    for k, c in [(1024, 900), (256, 3000), (64, 64), (64, 200_000), (1024, 40_000)]:
        buf = torch.topk(spread(3000), k, largest=largest).values.contiguous()
        cand = spread(c)
        if c > 10_000:                  # most of them enter: the sampled selection of the K best
            cand = torch.cat([cand, torch.round(cand * 3) + (buf[-1] if largest else -buf[-1]).abs() * 2
                              * (1 if largest else -1)])
        cand = cand[cand > buf[-1]] if largest else cand[cand < buf[-1]]
        assert torch.isfinite(cand).all()
        want = torch.topk(torch.cat([buf, cand]), k, largest=largest).values
        native.insert_extremes(buf, cand.contiguous(), largest)
        assert torch.equal(buf, want), (k, c)


@pytest.mark.compiler
def test_hfmg_batches_inside_the_range_take_one_pass(monkeypatch):
    passes = []
    real = native.hfmg_pass
    monkeypatch.setattr(native, "hfmg_pass", lambda *a, **k: passes.append(a[1:3]) or real(*a, **k))
    g = torch.Generator().manual_seed(9)
    obs = HfmgObserver("l", 2048)
    obs.update(torch.randn(50_000, generator=g) * 4)      # first batch: extremes, then the bins
    assert len(passes) == 2 and passes[0] == (math.inf, -math.inf)
    for _ in range(3):                                    # inside the range: one pass each
        obs.update(torch.randn(50_000, generator=g))
    assert len(passes) == 5
    obs.update(torch.randn(50_000, generator=g) * 8)      # wider: a pass, then the union's bins
    assert len(passes) == 7 and passes[-1] == (obs.mn, obs.mx)
    assert int(obs.counts.sum()) == 250_000


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("value", [float("inf"), -float("inf")])
def test_hfmg_infinite_value_names_the_layer(backend, value):
    obs = HfmgObserver("conv4", 512)
    obs.update(torch.randn(100_000))
    bad = torch.randn(100_000)
    bad[12_345] = value
    obs.update(bad)
    with pytest.raises(CalibrationError, match="conv4"):
        obs.compute()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("factory", [lambda: IfmrStreamingObserver("conv3"), lambda: HfmgObserver("conv3", 512)],
                         ids=["ifmr_streaming", "hfmg"])
def test_nan_after_the_first_batch_names_the_layer(backend, factory):
    obs = factory()
    obs.update(torch.randn(100_000))
    bad = torch.randn(100_000)
    bad[77_777] = float("nan")
    obs.update(bad)
    with pytest.raises(CalibrationError, match="conv3"):
        obs.compute()


def test_kernels_build_where_a_compiler_exists():
    if native_build.find_compiler() is None:
        assert native.library() is None and "compiler" in native.unavailable_reason()
    else:
        assert native.library() is not None, native.unavailable_reason()


def test_no_compiler_or_turned_off_falls_back_to_torch(monkeypatch, tmp_path, caplog):
    x = data("relu", 50_000, seed=9)
    want = HfmgObserver("l", 512)
    with monkeypatch.context() as m:
        use_backend(m, False)
        want.update(x)
    for env, reason in ((("CC", str(tmp_path / "no-such-cc")), "was not found"),
                        (("AMCT_TORCH_NATIVE", "0"), "turned off")):
        with monkeypatch.context() as m:
            m.setattr(native, "_state", {})
            m.setattr(backends, "_chosen", {})
            m.setattr(backends, "_fallback", {"used": False, "warned": False})
            m.setenv("AMCT_TORCH_CACHE", str(tmp_path / "cache"))
            m.setenv(*env)
            assert native.library() is None
            assert reason in native.unavailable_reason()
            got = HfmgObserver("l", 512)
            with caplog.at_level(logging.WARNING, logger="amct_torch"):
                got.update(x)
                got.update(x)
                backends.warn_if_slow()       # what a finished calibration calls
                backends.warn_if_slow()
            assert torch.equal(got.counts, want.counts * 2)
            warnings = [r for r in caplog.records if "without the compiled histogram kernels" in r.message]
            # once per process, and not when the user turned the kernels off
            assert len(warnings) == (0 if env[0] == "AMCT_TORCH_NATIVE" else 1)
            caplog.clear()


@pytest.mark.compiler
def test_build_is_cached_and_reused(monkeypatch, tmp_path):
    with monkeypatch.context() as m:
        m.setattr(native, "_state", {})
        m.setenv("AMCT_TORCH_CACHE", str(tmp_path))
        assert native.library() is not None
        built = sorted(tmp_path.glob("*.so"))
        assert len(built) == 1
        digest = built[0].with_suffix(".sha256")
        assert digest.read_text().strip() == hashlib.sha256(built[0].read_bytes()).hexdigest()
        assert stat.S_IMODE(built[0].stat().st_mode) & 0o077 == 0
        stamp = built[0].stat().st_mtime_ns
        m.setattr(native, "_state", {})
        assert native.library() is not None
        assert sorted(tmp_path.glob("*.so")) == built and built[0].stat().st_mtime_ns == stamp


@pytest.mark.compiler
def test_unwritable_cache_folder_builds_in_a_temp_folder(monkeypatch, tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    with monkeypatch.context() as m:
        m.setattr(native, "_state", {})
        m.setenv("AMCT_TORCH_CACHE", str(blocked / "cache"))      # cannot be created
        m.setattr(native_build.tempfile, "tempdir", str(tmp_path / "tmp"))
        (tmp_path / "tmp").mkdir()
        assert native.library() is not None, native.unavailable_reason()
        assert list((tmp_path / "tmp").glob("amct_torch-*/hist_kernels-*.so"))


@pytest.mark.parametrize("nbins", [64, 1000, 2048])
def test_hfmg_losses_kernel_agrees_with_the_tensor_formula(nbins, monkeypatch):
    """The per-candidate kernel and the [candidates, 257] tensor evaluation are the same
    formula with float64 sums in another order."""
    g = torch.Generator().manual_seed(nbins)
    counts = (torch.rand(nbins, generator=g) ** 4 * 1000).to(torch.int64)
    counts[: nbins // 5] = 0                                # empty stretches and a ragged edge
    lefts, rights = hfmg.candidates(counts)
    accel = kernels.backend(backends.TorchBackend())
    kernel = accel.hfmg_search(counts, 0.37)[2] if accel is not None else hfmg.losses(counts, 0.37, lefts, rights)
    tensor = hfmg.losses(counts, 0.37, lefts, rights)
    if "native" in BACKENDS:
        torch.testing.assert_close(kernel, tensor, rtol=1e-12, atol=0)
        assert int(torch.argmin(kernel)) == int(torch.argmin(tensor))
    else:
        assert torch.equal(kernel, tensor)
    if "native_4_lanes" in BACKENDS:                       # both builds: the very same sums
        native.set_isa(0)
        try:
            assert torch.equal(accel.hfmg_search(counts, 0.37)[2], kernel)
        finally:
            native.set_isa(-1)


@pytest.mark.compiler
@pytest.mark.parametrize("nbins", [64, 257, 2048, 4096])
def test_hfmg_loss_lanes_give_the_int64_kernels_bits(nbins):
    """Four candidates a vector with the moments as float64 (exact below 2^53) form the same
    doubles as the per-candidate int64 code, at every width; candidate counts not a multiple
    of four and ranges whose destination bins are narrower than a source bin included."""
    g = torch.Generator().manual_seed(nbins + 1)
    counts = (torch.rand(nbins, generator=g) ** 6 * 5000).to(torch.int64)
    counts[nbins // 3: nbins // 3 + nbins // 10] = 0
    j = torch.arange(nbins)
    pref = torch.zeros(3, nbins + 1, dtype=torch.int64)
    torch.cumsum(torch.stack([counts, counts * j, counts * j * j]), 1, out=pref[:, 1:])
    cnt = torch.cat([counts, counts.new_zeros(1)])
    lefts, rights = hfmg.candidates(counts)
    extra_l = torch.tensor([0, 5, nbins - 3, 1])                # narrow and off-walk ranges
    extra_r = torch.tensor([nbins - 1, 6, nbins - 1, 2])
    lefts, rights = torch.cat([lefts, extra_l]), torch.cat([rights, extra_r])
    for isa in ([0, -1] if "native_4_lanes" in BACKENDS else [-1]):
        native.set_isa(isa)
        try:
            for m in (lefts.numel(), lefts.numel() - 1, 3, 1):  # every remainder of four
                lanes = native.hfmg_losses(pref, cnt, lefts[:m], rights[:m], 0.37, hfmg.FLT_EPS, 2)
                plain = native.hfmg_losses(pref, cnt, lefts[:m], rights[:m], 0.37, hfmg.FLT_EPS, 2,
                                           int64_only=True)
                assert torch.equal(lanes, plain), (isa, m)
        finally:
            native.set_isa(-1)


def test_temp_folder_of_someone_else_is_refused(monkeypatch, tmp_path):
    """The temp fallback must be private: a folder others can write to is not used."""
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    shared = tmp_path / "tmp" / f"amct_torch-{os.getuid()}"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with monkeypatch.context() as m:
        m.setattr(native_build.tempfile, "tempdir", str(tmp_path / "tmp"))
        with pytest.raises(RuntimeError, match="private"):
            native_build.writable_folder(blocked / "cache")
        shared.chmod(0o700)
        assert native_build.writable_folder(blocked / "cache") == shared


@pytest.mark.compiler
def test_kernels_built_without_openmp_give_the_same_state(monkeypatch, tmp_path):
    """Where the compiler has no OpenMP the slices run one after the other: same results."""
    want = states(lambda: IfmrStreamingObserver("l"), True, 1, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(native, "_state", {})
        m.setenv("AMCT_TORCH_CACHE", str(tmp_path))
        m.setattr(native_build, "build", lambda cc: native_build.build_with(cc, native_build.FLAGS))
        assert native.library() is not None
        got = states(lambda: IfmrStreamingObserver("l"), True, 1, monkeypatch)
    for k, v in want.state_dict().items():
        assert torch.equal(v, got.state_dict()[k]), k


def _compilers() -> list:
    """The compiler the kernels get, and gcc and clang where present (one path each)."""
    default = native_build.find_compiler()
    if default is None:
        return []
    found = {}
    for cc in (default, shutil.which("gcc"), shutil.which("clang")):
        if cc:
            found.setdefault(os.path.realpath(cc), cc)
    return sorted(found.values())


def _family(cc: str) -> str:
    """gcc, clang or '' from the compiler's real file name (cc is often a link to gcc)."""
    name = Path(os.path.realpath(cc)).name
    return "clang" if "clang" in name else "gcc" if "gcc" in name else ""


@pytest.mark.compiler
def test_every_compiler_present_gives_the_same_state(monkeypatch, tmp_path):
    """Kernels built by each compiler give the default build's states; gcc's import
    libgomp's parallel entry point (they run on torch's OpenMP threads). clang builds without
    OpenMP where its runtime, libomp, is missing."""
    found = _compilers()
    want = states(lambda: IfmrStreamingObserver("l"), True, 1, monkeypatch)
    for cc in found:
        with monkeypatch.context() as m:
            m.setattr(native, "_state", {})
            m.setenv("AMCT_TORCH_CACHE", str(tmp_path / Path(cc).name))
            m.setattr(native_build, "find_compiler", lambda cc=cc: cc)
            assert native.library() is not None, (cc, native.unavailable_reason())
            built = list((tmp_path / Path(cc).name).glob("hist_kernels-*.so"))
            assert len(built) == 1, cc
            if _family(cc) == "gcc":
                assert b"GOMP_parallel" in built[0].read_bytes()
            got = states(lambda: IfmrStreamingObserver("l"), True, 1, monkeypatch)
        for k, v in want.state_dict().items():
            assert torch.equal(v, got.state_dict()[k]), (cc, k)


def test_source_compiles_with_openmp_on_every_compiler_present(tmp_path):
    """gcc and clang, compile only (clang's OpenMP runtime may be missing at link time): no
    parallel region may sit inside a function of the AVX2 build, whose outlined body clang
    compiles without the target attribute (an error there once sent every clang build to the
    serial fallback)."""
    for cc in [c for c in _compilers() if _family(c)]:
        flags = [f for f in native_build.FLAGS if f != "-shared"]
        res = subprocess.run([cc, *flags, "-fopenmp", "-c", "-o", str(tmp_path / "k.o"), str(native_build.SOURCE)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (cc, res.stderr[-2000:])


def _portable_build(cc: str):
    """native_build.build with -DAMCT_PORTABLE: with OpenMP where the compiler has it."""
    try:
        return native_build.build_with(cc, native_build.FLAGS + ["-fopenmp", "-DAMCT_PORTABLE"])
    except RuntimeError:
        return native_build.build_with(cc, native_build.FLAGS + ["-DAMCT_PORTABLE"])


@pytest.mark.parametrize("factory", [lambda: IfmrStreamingObserver("l"), lambda: HfmgObserver("l", 2048)],
                         ids=["ifmr_streaming", "hfmg"])
@pytest.mark.compiler
def test_portable_build_gives_the_same_state(factory, monkeypatch, tmp_path):
    """The code other architectures compile (4 lanes, compare-and-select instead of x86's
    min/max instructions, no AVX2 gathers or floor) passes its self-check and gives the same
    states, the same search losses and the same factors."""
    g = torch.Generator().manual_seed(3)
    counts = (torch.rand(2048, generator=g) ** 4 * 900).to(torch.int64)
    search = kernels.backend(backends.TorchBackend()).hfmg_search
    want = states(factory, True, 1, monkeypatch)
    want_loss = search(counts, 0.37)[2]
    with monkeypatch.context() as m:
        m.setattr(native, "_state", {})
        m.setenv("AMCT_TORCH_CACHE", str(tmp_path))
        m.setattr(native_build, "build", _portable_build)
        assert native.library() is not None, native.unavailable_reason()
        assert native.set_isa(-1) == 0
        got = states(factory, True, 1, monkeypatch)
        got_factors = got.compute()
        got_loss = search(counts, 0.37)[2]
    for k, v in want.state_dict().items():
        assert torch.equal(v, got.state_dict()[k]), k
    assert got_factors == want.compute()
    assert torch.equal(got_loss, want_loss)


def test_slices_per_thread_respect_element_and_histogram_minimums(monkeypatch):
    monkeypatch.setattr(native, "MIN_PER_THREAD", 1000)
    pieces = lambda n, threads, slots, max_slice=1 << 30: native.slice_bounds(n, max_slice, threads, slots).numel() - 1
    assert pieces(88_000, 64, 16385) == 2           # √(88000 / 16385) → 2 private histograms
    assert pieces(1_000_000, 64, 16385) == 7        # √61
    assert pieces(1_000_000, 2, 16385) == 2         # the threads there are
    assert pieces(20_000, 8, 16385) == 1
    assert pieces(999, 8, 0) == 1                   # < MIN_PER_THREAD for a second thread
    assert pieces(10, 1, 0, max_slice=3) == 4       # no slice over max_slice, whatever the threads
    assert pieces(10_000, 2, 0, max_slice=4000) == 4   # 3 would leave one thread twice the work
    assert pieces(10_000, 3, 0, max_slice=4000) == 3
    assert pieces(10_000, 3, 0, max_slice=3000) == 6
    b = native.slice_bounds(1_000_003, 1 << 30, 3, 0)
    assert b[0] == 0 and b[-1] == 1_000_003 and bool((b.diff() > 0).all())


@pytest.mark.parametrize("kind", ["normal", "relu", "heavy", "shifted"])
def test_ifmr_histogram_losses_kernel_agrees_with_the_tensor_formula(kind, monkeypatch):
    """Streaming IFMR's loss per candidate: the kernel and the [candidates, levels] tensor
    evaluation (same operations, another summation order) agree, and so does the choice."""
    obs = IfmrStreamingObserver("l")
    for seed in range(3):
        obs.update(data(kind, 60_000, seed=seed + 10 * len(kind)))
    with_kernel = obs.compute()
    from amct_torch.algorithms import ifmr
    e, base = obs.frame
    args = (histogram.bin_starts(e, base, obs.nbins, "cpu"), math.ldexp(1.0, e), obs.counts,
            obs.dsum * math.ldexp(1.0, e))
    mx, mn = obs.top[0], obs.bottom[0]
    ratios = ifmr.candidate_ratios(0.7, 1.3, 0.01, "cpu")
    lo, hi, s = ifmr.candidate_grid(mx, mn, ratios, True)
    accel = kernels.backend(backends.TorchBackend())
    kernel = accel.ifmr_hist_losses(*args, lo, hi, s) if accel is not None else ifmr.histogram_losses(*args, lo, hi, s)
    tensor = ifmr.histogram_losses(*args, lo, hi, s)
    with monkeypatch.context() as m:
        use_backend(m, False)
        without = obs.compute()
    if "native" in BACKENDS:
        torch.testing.assert_close(kernel, tensor, rtol=1e-12, atol=1e-9 * float(tensor.abs().max()))
    else:
        assert torch.equal(kernel, tensor)
    assert with_kernel == without
    if "native_4_lanes" in BACKENDS:                       # both builds: the very same sums
        native.set_isa(0)
        try:
            assert torch.equal(accel.ifmr_hist_losses(*args, lo, hi, s), kernel)
        finally:
            native.set_isa(-1)


def reference_bounds(x: np.ndarray, group: int, lanes: int, k: int):
    """amct_chunk_bounds from its definition: within each run of group·lanes values, group j
    is lane j of its `group` vectors; the rest in contiguous groups; the k-th largest group
    maximum and k-th smallest group minimum (∓inf with fewer than k groups)."""
    nsb = x.size // (group * lanes)
    main = x[:nsb * group * lanes].reshape(nsb, group, lanes)
    rest = x[nsb * group * lanes:]
    his = [main.max(axis=1).reshape(-1)] + [rest[i:i + group].max(keepdims=True) for i in range(0, rest.size, group)]
    los = [main.min(axis=1).reshape(-1)] + [rest[i:i + group].min(keepdims=True) for i in range(0, rest.size, group)]
    hi, lo = np.concatenate(his), np.concatenate(los)
    if hi.size < k:
        return float(x.max()), float(x.min()), -math.inf, math.inf
    return float(x.max()), float(x.min()), float(np.sort(hi)[::-1][k - 1]), float(np.sort(lo)[k - 1])


@pytest.mark.compiler
@pytest.mark.parametrize("kind", ["normal", "relu", "ties", "adversarial", "small"])
def test_chunk_bounds_match_the_definition(kind):
    """The first batch's bounds at every vector width: large inputs take the sampled
    selection (the K-th of ~10^5 group extremes), including data built so that the sample
    overestimates and the selection falls back; ties and fewer groups than K."""
    rng = np.random.default_rng(len(kind))
    n = 1_000_003 if kind != "small" else 20_000
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "relu":
        x = np.maximum(x + 0.2, 0).astype(np.float32)
    elif kind == "ties":
        x = np.round(x * 4).astype(np.float32) / 4
    elif kind == "adversarial":                 # the groups the selection samples hold the largest
        x = np.abs(x)                           # values: its threshold keeps < K, it falls back
        for lanes in (4, 8):
            g = np.arange(4096) * ((n // 32) // 4096)         # the sampled group indices
            x[g // lanes * 32 * lanes + g % lanes] += 100.0   # a value in each of them
    widths = [(0, 4), (-1, 8)] if "native_4_lanes" in BACKENDS else [(-1, 8 if native.set_isa(-1) else 4)]
    try:
        for isa, lanes in widths:
            native.set_isa(isa)
            b = native.chunk_bounds(torch.from_numpy(x), 32, 1024, 2)
            want = reference_bounds(x, 32, lanes, 1024)
            assert (b.hi, b.lo, b.kth_hi, b.kth_lo) == want, (isa, kind)
            assert b.nans == 0
    finally:
        native.set_isa(-1)
