"""Protobuf's wire format, the few pieces the streaming readers and writers need.

Why by hand: protobuf's API serialises or parses a message whole, holding every weight twice.
Written field by field (key, length, bytes) a caffemodel or ONNX model can go to a file layer by
layer with the bytes ``SerializeToString`` gives (tested): ``copy_fields`` gives a writer the
message without the fields it streams, ``split_before`` where its field goes, ``parts_size`` the
length to announce; ``fields`` reads each field's bounds without parsing it."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable

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


#: one field of a message: (field number, wire type, field start, body start, field end).
#: The body of a length-delimited field is its payload ``[body start, field end)``; for the
#: other wire types it is the value after the key.
Field = tuple[int, int, int, int, int]


def fields(buf: Any, pos: int = 0, end: int = -1,
           varint_at: Callable[[Any, int, int], tuple[int, int]] = read_varint) -> Iterator[Field]:
    """Each top-level field (``Field``) of the message in ``buf[pos:end]`` (``end`` -1: up to
    ``len(buf)``), its varints read by ``varint_at(buf, position, end)`` -> (value, position
    after it). ``buf`` is bytes or a memory map with the default ``read_varint``; with another
    reader it is whatever that reader reads, e.g. a file read a few bytes at a time
    (``caffe/stream_reader``): one walk for both. A field number 0, a group, an unknown wire
    type or a field running past ``end`` is MalformedWire (protobuf's parser refuses them; our
    schemas have no groups)."""
    if end < 0:
        end = len(buf)
    while pos < end:
        key, body = varint_at(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, stop = varint_at(buf, body, end)
        elif wire == 1:
            stop = body + 8
        elif wire == 5:
            stop = body + 4
        elif wire == LENGTH_DELIMITED:
            size, body = varint_at(buf, body, end)
            stop = body + size
        else:
            raise MalformedWire(pos)
        if number == 0 or stop > end:
            raise MalformedWire(pos)
        yield number, wire, pos, body, stop
        pos = stop


def split_before(data: bytes, number: int, known: Sequence[int]) -> int:
    """The offset in a serialised message ``data`` where a field ``number`` would go: before
    the first top-level field with a larger number or unknown to the schema (``known``:
    the message's field numbers; protobuf writes unknown fields after the known ones). Why:
    a streaming writer puts the field it writes itself between these two halves."""
    known_set = set(known)
    for field, _, start, _, _ in fields(data):
        if field > number or field not in known_set:
            return start
    return len(data)


def parts_size(parts: Iterable[Any]) -> int:
    """The bytes of a field's encoding held as ``parts`` (bytes-like objects, or sources written
    piece by piece that announce their length as ``nbytes``): the length written before it."""
    total = 0
    for p in parts:
        n = getattr(p, "nbytes", None)
        total += len(p) if n is None else n
    return total


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
