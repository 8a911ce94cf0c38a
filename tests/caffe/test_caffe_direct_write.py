"""``direct_io.DirectFile``: the file holds exactly the bytes given, in order, whatever the
sizes of the pieces and the buffer boundaries they cross, direct or not; a writer error (a full
disk) reaches the caller; a discarded file stays unwritten past what was sent; the streaming
caffemodel writer through it leaves no file behind when its layers fail.

Reference: the concatenation of the pieces (``b"".join``), read back with a plain ``open``."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from amct_torch.caffe.stream_writer import write_caffemodel
from amct_torch.files import direct_io
from amct_torch.files.direct_io import DirectFile
from amct_torch.proto import amct_caffe_pb2 as pb


def _pieces(seed: int, buffer: int) -> list:
    """Pieces of many sizes: empty, single bytes, ones that end exactly on a buffer boundary,
    ones larger than two buffers; bytes, bytearrays and numpy arrays (as the writers give)."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 5, buffer - 6, buffer, 3, 2 * buffer + 17, 4096, 1, buffer * 3 - 1, 0, 12345]
    out: list = []
    for k, n in enumerate(sizes):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        out.append((bytes(data), bytearray(data.tobytes()), data.view(np.uint8))[k % 3])
    out.append(rng.standard_normal(3000).astype(np.float32))  # a float array, as a blob's data
    return out


def _expected(pieces: list) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in pieces)


@pytest.mark.parametrize("threaded", [True, False])
def test_file_is_the_concatenation_of_the_pieces(tmp_path, monkeypatch, threaded):
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", 3 * 4096)
    pieces = _pieces(0, 3 * 4096)
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with DirectFile(fd, threaded=threaded) as f:
        for p in pieces:
            assert f.write(p) == memoryview(p).nbytes
    assert path.read_bytes() == _expected(pieces)


def test_large_default_buffers_and_an_empty_file(tmp_path):
    pieces = [np.arange(3_000_000, dtype=np.float32), b"tail"]
    path = tmp_path / "big.bin"
    with DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)) as f:
        for p in pieces:
            f.write(p)
    assert path.read_bytes() == _expected(pieces)
    empty = tmp_path / "empty.bin"
    with DirectFile(os.open(empty, os.O_WRONLY | os.O_CREAT, 0o644)):
        pass
    assert empty.read_bytes() == b""


def test_direct_writes_refused_late_fall_back_to_ordinary_writes(tmp_path, monkeypatch):
    """A filesystem that takes the flag but refuses the writes (EINVAL): the same bytes."""
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", 2 * 4096)
    monkeypatch.setattr(direct_io, "_direct_on", lambda fd: True)
    monkeypatch.setattr(direct_io, "_direct_off", lambda fd: None)
    real = os.pwrite
    refused: list = []

    def pwrite(fd, data, offset):
        if not refused:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", pwrite)
    pieces = _pieces(1, 2 * 4096)
    path = tmp_path / "f.bin"
    with DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)) as f:
        for p in pieces:
            f.write(p)
        assert not f.direct
    assert refused == [0] and path.read_bytes() == _expected(pieces)


@pytest.mark.parametrize("threaded", [True, False])
def test_a_write_error_reaches_the_caller_and_closes_the_file(tmp_path, monkeypatch, threaded):
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", 4096)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwrite", full)
    fd = os.open(tmp_path / "f.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    f = DirectFile(fd, threaded=threaded)
    with pytest.raises(OSError) as ei:
        for _ in range(4):
            f.write(bytes(4096))
        f.close()
    assert ei.value.errno == errno.ENOSPC
    f.close(discard=True)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def test_discard_writes_nothing_more(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", 4096)
    path = tmp_path / "f.bin"
    with pytest.raises(RuntimeError), DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)) as f:
        f.write(b"a" * 4096 + b"partial")
        raise RuntimeError("the caller failed")
    assert path.read_bytes() == b"a" * 4096  # the full buffer went out, the partial one did not


def test_a_failing_layer_leaves_no_caffemodel_and_no_temporary(tmp_path):
    net = pb.NetParameter(name="n")

    def layers():
        yield pb.LayerParameter(name="a", type="ReLU"), [np.ones((300, 300), np.float32)]
        raise ValueError("a layer failed")
    with pytest.raises(ValueError):
        write_caffemodel(str(tmp_path / "m.caffemodel"), net, layers())
    assert os.listdir(tmp_path) == []
