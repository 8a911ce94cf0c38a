"""Bounds on the size of a model's structure, checked before the files are parsed.

Why: protobuf turns every message into an object of several hundred bytes, so a small file of
empty messages becomes gigabytes once parsed (a 7 MB caffemodel of 2.3 million empty layers
takes 1.5 GB in ``ParseFromString`` alone; an 18 MB prototxt of empty layers 2.7 GB and a minute
of text parsing). Real nets have at most a few thousand layers and a few blobs per layer, so
counts far above that are refused with a ModelError naming the file, before any parsing:

* ``MAX_LAYERS`` (100,000) layers in a prototxt or a caffemodel;
* ``MAX_BLOBS`` (200,000) blobs in a caffemodel (all layers together).

The caffemodel is counted by walking only the protobuf wire format of the net and of each layer
(tags and lengths; blob data is skipped, never decoded), stopping at the first count over its
limit, so the walk itself is bounded by the limits. The prototxt is counted with one regular
expression over the text. Under the limits parsing is linear in the file size
(``tests/caffe/test_caffe_parse_bounds.py``).
"""
from __future__ import annotations

import re

from amct_torch.errors import ModelError

MAX_LAYERS = 100_000
MAX_BLOBS = 200_000

_NET_LAYER, _NET_V1_LAYERS = 100, 2  # NetParameter.layer, NetParameter.layers (V1)
_BLOBS_FIELD = {_NET_LAYER: 7, _NET_V1_LAYERS: 6}  # LayerParameter.blobs, V1LayerParameter.blobs
_LAYER_TOKEN = re.compile(rb"\blayers?\s*[:{<]")


class _Malformed(Exception):
    """The wire format is broken: the protobuf parser reports it with its own message."""


def check_prototxt_counts(raw: bytes, path: str) -> None:
    """Refuse a prototxt declaring more than ``MAX_LAYERS`` layers (counted on the text)."""
    count = 0
    for _ in _LAYER_TOKEN.finditer(raw):
        count += 1
        if count > MAX_LAYERS:
            raise ModelError(f"the prototxt declares more than {MAX_LAYERS:,} layers, far more than "
                             "any real net; refused before parsing", file=path)


def check_caffemodel_counts(raw: bytes, path: str) -> None:
    """Refuse a caffemodel with more than ``MAX_LAYERS`` layers or ``MAX_BLOBS`` blobs."""
    layers = blobs = 0
    try:
        for number, start, end in _fields(raw, 0, len(raw)):
            if number not in _BLOBS_FIELD or start < 0:
                continue
            layers += 1
            if layers > MAX_LAYERS:
                raise ModelError(f"the caffemodel holds more than {MAX_LAYERS:,} layers, far more "
                                 "than any real net; refused before parsing", file=path)
            blob_field = _BLOBS_FIELD[number]
            for inner, _, _ in _fields(raw, start, end):
                if inner == blob_field:
                    blobs += 1
                    if blobs > MAX_BLOBS:
                        raise ModelError(f"the caffemodel holds more than {MAX_BLOBS:,} blobs, far "
                                         "more than any real net; refused before parsing", file=path)
    except _Malformed:
        return


def _fields(buf: bytes, pos: int, end: int):
    """(field number, payload start, payload end) of each field in ``buf[pos:end]``; the
    payload bounds are -1 for fields that are not length-delimited."""
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos, end)
            yield number, -1, -1
        elif wire == 1:
            pos += 8
            yield number, -1, -1
        elif wire == 5:
            pos += 4
            yield number, -1, -1
        elif wire == 2:
            size, pos = _read_varint(buf, pos, end)
            if pos + size > end:
                raise _Malformed()
            yield number, pos, pos + size
            pos += size
        else:
            raise _Malformed()  # groups and invalid wire types: left to the parser
        if pos > end:
            raise _Malformed()


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A base-128 varint at ``pos``: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed()
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
