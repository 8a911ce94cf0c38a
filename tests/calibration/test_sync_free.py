"""The calibration path issues no host synchronisation (what a CUDA calibration needs).

Proof without a GPU: the ``meta`` device has shapes but no values, so any ``.item()``,
``.tolist()``, ``float(t)`` or data-dependent shape raises there. Every observer and a whole
calibration forward (hooks included; batch_num larger than the batches run, so no factor is
computed — ``compute()`` is allowed one read) must complete on it. With a GPU the same runs
on CUDA under ``torch.cuda.set_sync_debug_mode("error")``. On real CPU tensors the torch
backend's updates are counted with ``SyncCounter`` (zero expected).
"""
from __future__ import annotations

import pytest
import torch

from amct_torch.calibration import backends
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver
from amct_torch.workflow.examples import EXAMPLE_INPUT_SHAPE, example_model
from helpers.sync import calibration_model, count_syncs

OBSERVERS = [lambda: IfmrStreamingObserver("conv1"), lambda: HfmgObserver("conv1", 2048),
             lambda: IfmrExactObserver("conv1")]
IDS = ["ifmr_streaming", "hfmg", "ifmr_exact"]
#: batch shapes: conv-like, tiny (fewer elements than the top-K buffers), one large flat tensor
SHAPES = [(8, 16, 14, 14), (3,), (2, 300_000)]


@pytest.fixture(params=["meta", pytest.param("cuda", marks=pytest.mark.gpu)])
def strict_device(request):
    """A device where a host read fails: meta always, CUDA (sync debug mode "error") if present."""
    if request.param == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield "cuda"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return
    yield "meta"


def _batch(shape, device):
    if device == "meta":
        return torch.empty(*shape, device="meta")
    return torch.randn(*shape, device=device)


@pytest.mark.parametrize("factory", OBSERVERS, ids=IDS)
def test_observer_updates_never_read_back(factory, strict_device):
    obs = factory()
    for shape in SHAPES:
        for _ in range(2):
            obs.update(_batch(shape, strict_device))


@pytest.mark.parametrize("algo", ["ifmr", "hfmg"])
def test_whole_calibration_forward_never_reads_back(algo, strict_device, tmp_path):
    model, _graph = calibration_model(tmp_path, *example_model(), algo=algo)
    model.to(strict_device)
    x = _batch((4,) + tuple(EXAMPLE_INPUT_SHAPE[1:]), strict_device)
    for _ in range(3):
        out = model(x)
    assert isinstance(out, dict) and out


@pytest.mark.slow
def test_nsfw_calibration_forward_never_reads_back(nsfw_model, strict_device, tmp_path):
    """The real ResNet-50 (53 quantized layers, Eltwise, BN folded) with its hooks."""
    model, graph = calibration_model(tmp_path, *nsfw_model)
    model.to(strict_device)
    x = _batch((2, 3, 224, 224), strict_device)
    for _ in range(2):
        model(x)
    assert graph.session.batches_seen == 2 and not graph.session.done


@pytest.mark.parametrize("factory", OBSERVERS, ids=IDS)
def test_torch_backend_updates_count_zero_host_reads(factory, monkeypatch):
    """The same property measured on real CPU values with the torch backend (the path every
    non-CPU device takes): no read at all during updates, one batch of reads in compute."""
    monkeypatch.setitem(backends._chosen, "cpu", backends.TorchBackend())
    obs = factory()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(*s, generator=g) * (i + 1) for i, s in enumerate(SHAPES * 2)]
    reads, where, _ = count_syncs(lambda: [obs.update(b) for b in batches])
    assert reads == 0, where
    # and the state is the sequential one: the compute reads it back and gives factors
    scale, offset = obs.compute()
    assert scale > 0 and -128 <= offset <= 127


def test_sync_counter_sees_the_reads_it_claims_to(monkeypatch):
    """The counter is not blind: a .item(), a mask gather and a float() are each counted."""
    x = torch.randn(100)
    reads, where, _ = count_syncs(lambda: (x.max().item(), x[x > 0], float(x.sum())))
    assert reads >= 3 and "item" in where and ("nonzero" in where or "masked_select" in where or
                                                "_local_scalar_dense" in where)


def _state_tensors(obs) -> dict:
    if isinstance(obs, IfmrStreamingObserver):
        st = obs.state
        out = {k: getattr(st, k) for k in ("count", "top", "bottom", "counts", "dsum", "frame", "range")}
    else:
        out = {"counts": obs._counts, "range": obs._range, "seen": obs._seen}
    return out


@pytest.mark.parametrize("factory", OBSERVERS[:2], ids=IDS[:2])
def test_updates_keep_the_state_storage(factory, cpu_backend):
    """Every update writes into the same state tensors (no new ones), so that an update
    captured in a CUDA graph reads and writes the live state on every replay; batches that
    widen the range, shrink back and hold NaN included."""
    obs = factory()
    g = torch.Generator().manual_seed(1)
    obs.update(torch.randn(50_000, generator=g))
    ptrs = {k: t.data_ptr() for k, t in _state_tensors(obs).items()}
    for scale in (4.0, 0.5, 16.0, 1.0):
        obs.update(torch.randn(30_000, generator=g) * scale)
    bad = torch.randn(1000, generator=g)
    bad[3] = float("nan")
    obs.update(bad)
    assert {k: t.data_ptr() for k, t in _state_tensors(obs).items()} == ptrs
    flags = (obs._bad.data_ptr(), obs._first_bad.data_ptr())
    obs.update(bad)
    assert (obs._bad.data_ptr(), obs._first_bad.data_ptr()) == flags
    with pytest.raises(Exception, match="batch 6"):
        obs.compute()


@pytest.mark.parametrize("factory", OBSERVERS, ids=IDS)
def test_channels_last_batches_give_the_same_factors(factory, cpu_backend):
    """A channels-last activation (a faster CPU forward) calibrates exactly like its NCHW
    twin; the order-free observers read it in memory order, without copying it."""
    from amct_torch.calibration.observers import _flat
    g = torch.Generator().manual_seed(2)
    xs = [torch.relu(torch.randn(4, 16, 9, 7, generator=g) * s) for s in (1.0, 3.0, 0.5)]
    a, b = factory(), factory()
    for x in xs:
        a.update(x)
        b.update(x.to(memory_format=torch.channels_last))
    assert a.compute() == b.compute()
    cl = xs[0].to(memory_format=torch.channels_last)
    flat = _flat(cl, a.order_free)
    assert (flat.data_ptr() == cl.data_ptr()) == a.order_free
