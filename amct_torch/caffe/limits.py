"""Bounds on the size of a model's structure, checked before the files are parsed.

Why: protobuf makes an object of hundreds of bytes of every message, so a small file of empty
messages becomes gigabytes once parsed. ``MAX_LAYERS`` layers (prototxt or caffemodel) and
``MAX_BLOBS`` blobs (caffemodel) are far above real nets and refused with a ModelError naming the
file before any parsing: the caffemodel is counted on its wire format (blob data skipped, the
walk stopping at the first count over its limit), the prototxt with one regular expression.
docs/caffe_format.md, "Limits"."""
from __future__ import annotations

import re

from amct_torch.errors import ModelError
from amct_torch.files.protowire import LENGTH_DELIMITED, MalformedWire, fields

MAX_LAYERS = 100_000
MAX_BLOBS = 200_000

_NET_LAYER, _NET_V1_LAYERS = 100, 2  # NetParameter.layer, NetParameter.layers (V1)
_BLOBS_FIELD = {_NET_LAYER: 7, _NET_V1_LAYERS: 6}  # LayerParameter.blobs, V1LayerParameter.blobs
_LAYER_TOKEN = re.compile(rb"\blayers?\s*[:{<]")


def check_prototxt_counts(raw: bytes, path: str) -> None:
    """Refuse a prototxt declaring more than ``MAX_LAYERS`` layers (counted on the text)."""
    for count, _ in enumerate(_LAYER_TOKEN.finditer(raw), start=1):
        if count > MAX_LAYERS:
            raise ModelError(f"the prototxt declares more than {MAX_LAYERS:,} layers, far more than "
                             "any real net; refused before parsing", file=path)


def check_caffemodel_counts(raw: bytes, path: str) -> None:
    """Refuse a caffemodel with more than ``MAX_LAYERS`` layers or ``MAX_BLOBS`` blobs."""
    layers = blobs = 0
    try:
        for number, wire, _, start, end in fields(raw, 0, len(raw)):
            if number not in _BLOBS_FIELD or wire != LENGTH_DELIMITED:
                continue
            layers += 1
            if layers > MAX_LAYERS:
                raise ModelError(f"the caffemodel holds more than {MAX_LAYERS:,} layers, far more "
                                 "than any real net; refused before parsing", file=path)
            blob_field = _BLOBS_FIELD[number]
            for inner, _, _, _, _ in fields(raw, start, end):
                if inner == blob_field:
                    blobs += 1
                    if blobs > MAX_BLOBS:
                        raise ModelError(f"the caffemodel holds more than {MAX_BLOBS:,} blobs, far "
                                         "more than any real net; refused before parsing", file=path)
    except MalformedWire:  # left to the parser, which reports it in its words
        return
