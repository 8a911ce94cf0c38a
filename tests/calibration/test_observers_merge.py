"""Observers: merge vs sequential update, state round trip, errors, dtypes, factory."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from amct_torch.algorithms.ifmr import ifmr_exact
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver, make_observer
from amct_torch.errors import CalibrationError


def _data(seed, device):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(30000, generator=g) * 2
    b = torch.randn(5, 7, 100, generator=g) * 5 + 3
    return a.to(device), b.to(device)


def _sequential_and_merged(make, a, b):
    """(one observer updated with ``a`` then ``b``; one updated with ``a`` into which one updated
    with ``b`` was merged); ``make()`` gives a fresh observer."""
    seq = make(); seq.update(a); seq.update(b)
    A, B = make(), make()
    A.update(a); B.update(b)
    A.merge(B)
    return seq, A


def test_exact_merge_is_bitwise(device):
    a, b = _data(0, device)
    seq, A = _sequential_and_merged(lambda: IfmrExactObserver("l"), a, b)
    assert torch.equal(seq.state_dict()["data"], A.state_dict()["data"])
    assert seq.compute() == A.compute()
    ref = ifmr_exact(torch.cat([a.reshape(-1), b.reshape(-1)]))
    assert seq.compute() == (ref.scale, ref.offset)


def test_streaming_merge_equals_sequential(device):
    a, b = _data(1, device)
    seq, A = _sequential_and_merged(lambda: IfmrStreamingObserver("l"), a, b)
    s1, s2 = seq.state_dict(), A.state_dict()
    for key in ("count", "top", "bottom", "counts", "frame", "range"):
        assert torch.equal(s1[key], s2[key]), key
    torch.testing.assert_close(s1["dsum"], s2["dsum"], rtol=1e-6, atol=1e-6)
    assert seq.compute() == A.compute()
    # the exact extremes are the data's
    flat = torch.cat([a.reshape(-1), b.reshape(-1)])
    assert torch.equal(seq.top, torch.topk(flat, seq.topk).values)
    assert int(seq.counts.sum()) == flat.numel()


def test_hfmg_merge_same_range_is_exact(device):
    a, b = _data(2, device)
    b = b.clamp(float(a.min()), float(a.max()))
    seq, A = _sequential_and_merged(lambda: HfmgObserver("l", 1024), a, b)
    assert int(A.counts.sum()) == int(seq.counts.sum())
    # B's own range is narrower, so its bins are redistributed: only the totals are exact;
    # a merge into an observer on the same range is exact
    C = HfmgObserver("l", 1024); C.update(a)
    D = HfmgObserver("l", 1024); D.load_state_dict(C.state_dict()); D.reset(); D.update(a)
    C.merge(D)
    assert torch.equal(C.counts, 2 * D.counts)


@pytest.mark.parametrize("cls", [IfmrExactObserver, IfmrStreamingObserver, HfmgObserver])
def test_state_round_trip(cls, device):
    a, b = _data(3, device)
    o = cls("l"); o.update(a); o.update(b)
    st = o.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in st.values())
    p = cls("l"); p.load_state_dict({k: v.clone() for k, v in st.items()})
    assert p.compute() == o.compute()
    p.update(a); o.update(a)
    assert p.compute() == o.compute()
    o.reset()
    with pytest.raises(CalibrationError):
        o.compute()


@pytest.mark.parametrize("cls", [IfmrExactObserver, IfmrStreamingObserver, HfmgObserver])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_names_layer_and_first_bad_batch(cls, bad, device):
    """NaN/Inf is flagged on the device during update (no host read) and raised when the
    factors (or the state) are asked for, naming the layer and the first bad batch."""
    x = torch.randn(5000, device=device)
    y = x.clone()
    y[1234] = bad
    o = cls("conv3_1")
    for batch in (x, y, x, y):
        o.update(batch)
    with pytest.raises(CalibrationError, match=r"conv3_1.*batch 2|batch 2.*conv3_1"):
        o.compute()
    with pytest.raises(CalibrationError, match="conv3_1"):
        o.state_dict()
    # a merged observer carries the flag and the earliest bad batch
    a, b = cls("conv3_1"), cls("conv3_1")
    a.update(x); a.update(x); a.update(y)
    b.update(x); b.update(y)
    a.merge(b)
    with pytest.raises(CalibrationError, match="batch 2"):
        a.compute()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", [IfmrExactObserver, IfmrStreamingObserver, HfmgObserver])
def test_half_precision_is_computed_in_float32(cls, dtype, device):
    x = torch.randn(20000, device=device).to(dtype)
    o, r = cls("l"), cls("l")
    o.update(x); r.update(x.float())
    assert o.compute() == r.compute()


def test_factory():
    base = dict(max_percentile=0.999999, min_percentile=0.999999, search_range=(0.7, 1.3), search_step=0.01,
                num_of_bins=2048, asymmetric=False)
    assert isinstance(make_observer("a", SimpleNamespace(act_algo="ifmr", **base)), IfmrStreamingObserver)
    assert isinstance(make_observer("a", SimpleNamespace(act_algo="ifmr", **base), ifmr_mode="exact"),
                      IfmrExactObserver)
    h = make_observer("a", SimpleNamespace(act_algo="hfmg", **base))
    assert isinstance(h, HfmgObserver) and h.nbins == 2048 and not h.asymmetric
