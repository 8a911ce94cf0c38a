"""Writing our output nets as Caffe files, with ``quant_param.offset`` in a form the target
consumer reads.

Why: AMCT writes ``offset`` as a one-byte string (``offset: "\\375"`` for −3). OpenCV's Caffe
importer (4.x, the reference consumer) rejects every string value inside an unknown layer
param, and reads a negative number without its sign (``offset: -3`` reaches a custom layer as
"3"). The form that survives is the byte's unsigned value 0…255 (``offset: 253``); readers
turn it back into the int8 −3. See docs/export.md.
"""
from __future__ import annotations

import re
from typing import Optional

from google.protobuf import text_encoding

from amct_torch.caffe.netio import caffemodel_bytes, net_to_prototxt_text
from amct_torch.caffe.stream_writer import write_caffemodel
from amct_torch.export.caffe.netbuild import EmittedNet
from amct_torch.files.atomic import atomic_write_bytes, atomic_write_text
from amct_torch.proto import amct_caffe_pb2 as pb

OFFSET_FORMS = ("uint8", "bytes")

_OFFSET = re.compile(r'(quant_param \{[^{}]*?\boffset: )"((?:[^"\\]|\\.)*)"', re.S)


def _uint8_offsets(text: str) -> str:
    def repl(m: re.Match) -> str:
        raw = text_encoding.CUnescape(m.group(2))
        return f"{m.group(1)}{raw[0] if raw else 0}"
    return _OFFSET.sub(repl, text)


def prototxt_text(net: pb.NetParameter, offset_form: str = "uint8") -> str:
    """The prototxt text of ``net``; ``offset_form`` "uint8" (OpenCV-readable, default) or
    "bytes" (AMCT's one-byte string)."""
    if offset_form not in OFFSET_FORMS:
        raise ValueError(f"offset_form must be one of {OFFSET_FORMS}, got {offset_form!r}")
    text = net_to_prototxt_text(net)
    return _uint8_offsets(text) if offset_form == "uint8" else text


def write_caffe(net: pb.NetParameter, prototxt_path: str, caffemodel_path: Optional[str],
                offset_form: str = "uint8") -> None:
    """Write ``net`` as prototxt (no blobs; offset form as chosen) and caffemodel (binary,
    with blobs; ``quant_param.offset`` stays the schema's one byte there), each atomically."""
    text = prototxt_text(net, offset_form)
    binary = None
    if caffemodel_path is not None:
        binary = caffemodel_bytes(net)  # unknown-field entries dropped, blobs not copied
    atomic_write_text(prototxt_path, text)
    if caffemodel_path is not None and binary is not None:
        atomic_write_bytes(caffemodel_path, binary)


def write_caffe_layers(emitted: EmittedNet, prototxt_path: str, caffemodel_path: str,
                       offset_form: str = "uint8") -> None:
    """``write_caffe`` for an emitted net whose blobs are made layer by layer: the caffemodel
    is streamed (``caffe/stream_writer.py``: the same bytes, one layer's arrays in memory at a
    time), each file atomic."""
    atomic_write_text(prototxt_path, prototxt_text(emitted.net, offset_form))
    write_caffemodel(caffemodel_path, emitted.net, emitted.layer_blobs())
