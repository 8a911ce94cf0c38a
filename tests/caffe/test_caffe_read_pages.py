"""The layer-by-layer caffemodel reader makes its arrays with numpy's huge-page advice off and
gives numpy's setting back afterwards, whatever it was and however the read ends; the arrays are
those protobuf's whole-message parse gives.

Reference: numpy's own switch (its return value is the setting it replaces) and
``NetParameter.ParseFromString`` with ``blob_to_array``."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe import stream_reader
from amct_torch.caffe.netio import array_to_blob, blob_to_array
from amct_torch.caffe.stream_reader import read_weights
from amct_torch.proto import amct_caffe_pb2 as pb

_core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
switch = _core.multiarray._set_madvise_hugepage


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(0)
    net = pb.NetParameter(name="n")
    for name, shapes in (("conv", [(8, 3, 3, 3), (8,)]), ("fc", [(300, 2000), (300,)])):
        layer = net.layer.add(name=name, type="X")
        for s in shapes:
            array_to_blob(rng.standard_normal(s).astype(np.float32), layer.blobs.add())
    path = tmp_path / "m.caffemodel"
    path.write_bytes(net.SerializeToString())
    return str(path), net


@pytest.mark.parametrize("before", [True, False])
def test_arrays_made_with_small_pages_and_the_setting_restored(model, monkeypatch, before):
    path, net = model
    seen: list = []
    real = stream_reader._blob

    def spy(*a, **k):
        state = switch(False)  # the setting in force while this blob's array is made
        switch(state)
        seen.append(state)
        return real(*a, **k)
    monkeypatch.setattr(stream_reader, "_blob", spy)
    old = switch(before)
    try:
        got = read_weights(path, {"conv", "fc"})
        assert switch(before) == before  # given back
    finally:
        switch(old)
    assert len(seen) == 4 and not any(seen)
    want = {l.name: [blob_to_array(b, "f", l.name, i) for i, b in enumerate(l.blobs)] for l in net.layer}
    assert got is not None and list(got) == list(want)
    for k in want:
        for g, w in zip(got[k], want[k]):
            np.testing.assert_array_equal(g, w)


def test_setting_restored_when_the_read_fails(model, monkeypatch):
    path, _ = model

    def broken(*a, **k):
        raise RuntimeError("disk gone")
    monkeypatch.setattr(stream_reader, "_blob", broken)
    old = switch(True)
    try:
        with pytest.raises(RuntimeError):
            read_weights(path, {"conv"})
        assert switch(True) is True
    finally:
        switch(old)
