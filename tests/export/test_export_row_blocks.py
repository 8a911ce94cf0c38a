"""``layer_quant.RowBlocks``: a layer's int8 codes or fake-quant weights made a block of rows at a
time are the whole-tensor formula's values, in C order, in any view shape; the Caffe writers
take them as blobs and write the bytes protobuf writes for the same arrays.

References: ``quantize`` on the whole tensor (codes; codes·s for the fake-quant weights) and
``array_to_blob(...).SerializeToString()`` (protobuf's own encoding of a blob)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.algorithms.quant import channel_view, quantize
from amct_torch.caffe.netio import array_to_blob
from amct_torch.caffe.stream_writer import _Blocks, blob_parts
from amct_torch.export import layer_quant as lqmod
from amct_torch.export.layer_quant import RowBlocks


def _case(kind: str, shape: tuple, groups: int, per_channel: bool, seed: int = 3):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    c_out = shape[1] * groups if kind == "Deconvolution" else shape[0]
    sw = torch.from_numpy(rng.uniform(0.005, 0.02, c_out if per_channel else 1).astype(np.float32))
    return w, channel_view(sw, shape, kind, groups)


def _encoded(arr) -> bytes:
    out = bytearray()
    for p in blob_parts(arr):
        if isinstance(p, _Blocks):
            for block in p:
                out += block
        else:
            out += p
    return bytes(out)


@pytest.mark.parametrize("chunk", [50, 1000, 1 << 22])
@pytest.mark.parametrize("kind,shape,groups,per_channel", [
    ("Convolution", (70, 3, 3, 3), 1, True),
    ("InnerProduct", (33, 100), 1, False),
    ("InnerProduct", (300, 200), 1, True),
    ("Deconvolution", (12, 5, 3, 3), 3, True),
])
def test_blocks_are_the_whole_tensor_values(kind, shape, groups, per_channel, chunk, monkeypatch):
    monkeypatch.setattr(lqmod, "CHUNK_ELEMENTS", chunk)
    w, s = _case(kind, shape, groups, per_channel)
    q = quantize(w, s)
    codes, fake = RowBlocks(w, s, fake=False), RowBlocks(w, s, fake=True)
    assert codes.dtype == np.int8 and fake.dtype == np.float32 and codes.shape == shape
    assert codes.nbytes == w.numel() and fake.nbytes == 4 * w.numel()
    np.testing.assert_array_equal(np.concatenate(list(codes.blocks())), q.numpy().reshape(-1))
    assert np.concatenate(list(fake.blocks())).tobytes() == (q.float() * s).numpy().tobytes()
    flat = fake.reshape((int(np.prod(shape)),))
    assert flat.shape == (int(np.prod(shape)),)
    np.testing.assert_array_equal(np.asarray(flat), (q.float() * s).numpy().reshape(-1))
    with pytest.raises(ValueError):
        fake.reshape((7, 7))


@pytest.mark.parametrize("chunk", [1000, 1 << 22])
@pytest.mark.parametrize("shape", [(300, 200), (4, 3, 3, 3)])  # large (written by blocks) and small
def test_writer_encodes_blocks_as_protobuf_encodes_the_array(shape, chunk, monkeypatch):
    monkeypatch.setattr(lqmod, "CHUNK_ELEMENTS", chunk)
    w, s = _case("Convolution" if len(shape) == 4 else "InnerProduct", shape, 1, True)
    for fake in (True, False):
        rows = RowBlocks(w, s, fake=fake)
        whole = np.asarray(rows)
        assert _encoded(rows) == array_to_blob(whole).SerializeToString()
        assert _encoded(rows) == _encoded(whole)
