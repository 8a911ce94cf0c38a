"""Reading a caffemodel's weights layer by layer, each float blob read straight into its array.

Why: parsing a whole caffemodel holds the file's bytes, the parsed message and the arrays made
from it at once (three copies of a 553 MB VGG-16). This walks the ``NetParameter`` in the file
with ``protowire.fields``: each layer is parsed without its blobs, and a blob stored as one
packed ``data`` field (what Caffe writes) is read into a fresh float32 array, the only copy.
Anything else (V1 layers, other blob encodings, a malformed file, a net past the limits) is
left to ``netio.parse_caffemodel`` with its exact errors. Arrays are made without numpy's
huge-page advice (``_small_pages``; docs/performance.md has the figures)."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Callable, Optional

import numpy as np
from google.protobuf import message as _message

from amct_torch.caffe.blob_shape import blob_shape, check_value_count
from amct_torch.caffe.limits import MAX_BLOBS, MAX_LAYERS
from amct_torch.errors import ModelError
from amct_torch.files.protowire import LENGTH_DELIMITED, Field, MalformedWire, fields, read_varint
from amct_torch.proto import amct_caffe_pb2 as pb

__all__ = ["read_weights"]

_NET_LAYER, _NET_V1_LAYERS = 100, 2
_LAYER_BLOBS = 7
_BLOB_DATA, _BLOB_DIFF = 5, 6
_BLOB_META = (1, 2, 3, 4, 7)  # num, channels, height, width, shape
_SMALL = 1 << 20  # a layer smaller than this is read whole and walked in memory


class _Fallback(Exception):
    """The file needs the whole-message parser."""


class _Source:
    """Reads of ``f`` at absolute positions (a window of ``data`` starting at ``base`` when the
    bytes are already in memory)."""

    def __init__(self, f: IO[bytes], size: int, data: Optional[bytes] = None, base: int = 0) -> None:
        self.f, self.size, self.data, self.base = f, size, data, base

    def read(self, pos: int, n: int) -> bytes:
        if self.data is not None:
            return self.data[pos - self.base:pos - self.base + n]
        self.f.seek(pos)
        return self.f.read(n)

    def readinto(self, pos: int, out: np.ndarray) -> None:
        view = out.data.cast("B")
        if self.data is not None:
            view[:] = self.data[pos - self.base:pos - self.base + view.nbytes]
            return
        self.f.seek(pos)
        done = 0
        while done < view.nbytes:
            got = self.f.readinto(view[done:])  # type: ignore[attr-defined]  # a file opened "rb"
            if not got:
                raise _Fallback()
            done += got

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        """The varint at ``pos`` (before ``end``): (value, position after it); MalformedWire."""
        chunk = self.read(pos, min(10, end - pos))  # a varint is at most 10 bytes
        value, after = read_varint(chunk, 0, len(chunk))
        return value, pos + after

    def fields(self, start: int, end: int) -> Iterator[Field]:
        """The fields of the message in ``[start, end)`` (``protowire.fields`` over this file)."""
        return fields(self, start, end, _Source.varint)


def _parse(cls: Callable[[], _message.Message], data: bytes) -> _message.Message:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (_message.DecodeError, ValueError, RuntimeError):
        raise _Fallback() from None
    return msg


def _blob(src: _Source, start: int, end: int, path: str, layer: str, index: int) -> np.ndarray:
    """One BlobProto whose values are a single packed ``data`` field, as a float32 array of
    its declared shape, its values read from the file into the array."""
    meta = bytearray()
    data: Optional[tuple[int, int]] = None
    for number, wire, key, body, stop in src.fields(start, end):
        if number == _BLOB_DATA:
            if wire != LENGTH_DELIMITED or data is not None:
                raise _Fallback()  # unpacked or split values: the parser's job
            data = (body, stop)
        elif number in _BLOB_META:
            meta += src.read(key, stop - key)
        elif number != _BLOB_DIFF:  # gradients are never read
            raise _Fallback()  # double_data, raw_data, the AMCT integer fields: precedence rules
    if data is None or data[1] == data[0] or (data[1] - data[0]) % 4:
        raise _Fallback()
    shape = blob_shape(_parse(pb.BlobProto, bytes(meta)), path, layer, index)
    values = np.empty((data[1] - data[0]) // 4, np.float32)
    src.readinto(data[0], values)
    check_value_count(values, shape, path, layer, index)
    return values.reshape(shape)


def _layer(src: _Source, start: int, end: int, path: str, wanted: set[str],
           blob_count: list[int]) -> tuple[str, Optional[list[np.ndarray]]]:
    """The layer's name and, when it is wanted and has blobs, its blob arrays."""
    if end - start < _SMALL and src.data is None:
        src = _Source(src.f, src.size, src.read(start, end - start), start)
    rest = bytearray()
    blobs: list[tuple[int, int]] = []
    for number, wire, key, body, stop in src.fields(start, end):
        if number == _LAYER_BLOBS:
            if wire != LENGTH_DELIMITED:
                raise _Fallback()
            blobs.append((body, stop))
        else:
            rest += src.read(key, stop - key)
    blob_count[0] += len(blobs)
    if blob_count[0] > MAX_BLOBS:
        raise _Fallback()
    name = _parse(pb.LayerParameter, bytes(rest)).name
    if name not in wanted or not blobs:
        return name, None
    return name, [_blob(src, a, b, path, name, i) for i, (a, b) in enumerate(blobs)]


@contextmanager
def _small_pages() -> Iterator[None]:
    """numpy's huge-page advice for new arrays off inside the block, restored after (numpy's
    own switch; where a numpy has none, nothing changes)."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    before = switch(False) if switch is not None else None
    try:
        yield
    finally:
        if switch is not None:
            switch(before)


def read_weights(path: str, wanted: set[str]) -> Optional[dict[str, list[np.ndarray]]]:
    """The float blobs of the layers named in ``wanted`` (later duplicates win, as in Caffe's
    CopyTrainedLayersFrom), read layer by layer; None when the file is one the whole-message
    parser must read (see the module's docstring)."""
    if sys.byteorder != "little":
        return None
    with _small_pages():
        return _read_weights(path, wanted)


def _read_weights(path: str, wanted: set[str]) -> Optional[dict[str, list[np.ndarray]]]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            src = _Source(f, size)
            out: dict[str, list[np.ndarray]] = {}
            header = bytearray()
            layers, blob_count = 0, [0]
            for number, _, key, body, stop in src.fields(0, size):
                if number == _NET_V1_LAYERS:
                    return None
                if number != _NET_LAYER:
                    header += src.read(key, stop - key)
                    continue
                layers += 1
                if layers > MAX_LAYERS:
                    return None
                name, arrays = _layer(src, body, stop, path, wanted, blob_count)
                if arrays is not None:
                    out[name] = arrays
            if not layers:
                return None
            _parse(pb.NetParameter, bytes(header))
            return out
    except (_Fallback, MalformedWire, ModelError, OSError):  # the parser reports it, in its own order
        return None
