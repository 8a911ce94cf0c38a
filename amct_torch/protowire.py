"""Protobuf's wire format, the few pieces the streaming readers and writers need.

Why by hand: a caffemodel or an ONNX model is one protobuf message, and protobuf's own API
serialises or parses it whole, holding every weight twice. Written field by field (a key, a
length, the bytes) the same message can go to a file layer by layer, and the bytes are the
ones ``SerializeToString`` gives (tested); ``copy_fields`` gives such a writer the message
without the fields it streams itself. Used by ``caffe/stream_writer.py``,
``caffe/netio.py``, ``caffe/limits.py`` and ``export/onnx/stream.py``.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

#: wire type of a length-delimited field (a message, bytes, a packed repeated field)
LENGTH_DELIMITED = 2


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a base-128 varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_key(number: int) -> bytes:
    """The key of the length-delimited field ``number``."""
    return varint(number << 3 | LENGTH_DELIMITED)


class MalformedWire(ValueError):
    """The bytes are not a well-formed varint: the caller hands the file to protobuf's own
    parser, which reports the problem in its words."""


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (not reading at or past ``end``): (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise MalformedWire(pos)
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes, pos: int = 0, end: int = -1) -> Iterator[tuple[int, int, int, int]]:
    """(field number, field start, payload start, payload end) of each top-level field of the
    message in ``buf[pos:end]`` (``end`` -1: the whole buffer); the payload bounds are -1 for a
    field that is not length-delimited. Groups and unknown wire types are MalformedWire (our
    schemas have none)."""
    if end < 0:
        end = len(buf)
    while pos < end:
        start = pos
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = read_varint(buf, pos, end)
            yield number, start, -1, -1
        elif wire == 1:
            pos += 8
            yield number, start, -1, -1
        elif wire == 5:
            pos += 4
            yield number, start, -1, -1
        elif wire == LENGTH_DELIMITED:
            size, pos = read_varint(buf, pos, end)
            if pos + size > end:
                raise MalformedWire(pos)
            yield number, start, pos, pos + size
            pos += size
        else:
            raise MalformedWire(pos)
        if pos > end:
            raise MalformedWire(pos)


def copy_fields(src: Any, dst: Any, skip: Iterable[str] = ()) -> Any:
    """Copy every set field of message ``src`` into ``dst`` except those named in ``skip`` (the
    big repeated ones a streaming writer emits itself); returns ``dst``."""
    skipped = set(skip)
    for fd, value in src.ListFields():
        if fd.name in skipped:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)
    return dst
