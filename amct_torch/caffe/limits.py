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
from amct_torch.protowire import LENGTH_DELIMITED, MalformedWire, fields

MAX_LAYERS = 100_000
MAX_BLOBS = 200_000

_NET_LAYER, _NET_V1_LAYERS = 100, 2  # NetParameter.layer, NetParameter.layers (V1)
_BLOBS_FIELD = {_NET_LAYER: 7, _NET_V1_LAYERS: 6}  # LayerParameter.blobs, V1LayerParameter.blobs
_LAYER_TOKEN = re.compile(rb"\blayers?\s*[:{<]")


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
