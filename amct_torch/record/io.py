"""Reading and writing the record file (protobuf text ``ScaleOffsetRecord``).

Keys rendered across lines as in AMCT's documentation (``key: "`` / ``conv1`` / ``"``) are
read as ``conv1`` (see ``amct_torch.config.textproto``). Every write goes through a temporary
file in the same folder and ``os.replace``, so a crash never leaves a half-written record; the
merge functions read, update and rewrite the whole file that way.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

from amct_torch.config.textproto import parse_text_proto, read_text_file
from amct_torch.errors import RecordError
from amct_torch.proto import scale_offset_record_pb2 as pb
from amct_torch.record.atomic import atomic_write_text
from amct_torch.record.types import LayerRecord

_INT32 = (-2 ** 31, 2 ** 31 - 1)
_UINT32 = (0, 2 ** 32 - 1)


def parse_record_text(text: str, path: str = "<record>") -> dict[str, LayerRecord]:
    """Parse record ``text`` into ``{layer name: LayerRecord}`` in file order.

    Syntax errors, an entry without key and a key given twice raise ``RecordError`` naming
    ``path``. An empty text gives an empty dict (``validate_record`` refuses that).
    """
    msg = parse_text_proto(text, pb.ScaleOffsetRecord, path, RecordError, "record file")
    out: dict[str, LayerRecord] = {}
    for i, entry in enumerate(msg.record):
        if not entry.HasField("key") or entry.key == "":
            raise RecordError(f"record entry #{i + 1} has no key (layer name)", file=path)
        if entry.key in out:
            raise RecordError("layer appears more than once in the record", file=path,
                              layer=entry.key)
        v = entry.value
        out[entry.key] = LayerRecord(
            scale_d=float(v.scale_d) if v.HasField("scale_d") else None,
            offset_d=int(v.offset_d) if v.HasField("offset_d") else None,
            scale_w=[float(s) for s in v.scale_w], offset_w=[int(o) for o in v.offset_w],
            shift_bit=[int(s) for s in v.shift_bit],
            channels=int(v.channels) if v.HasField("channels") else None,
            height=int(v.height) if v.HasField("height") else None,
            width=int(v.width) if v.HasField("width") else None,
            skip_fusion=bool(v.skip_fusion))
    return out


def read_record(path: str) -> dict[str, LayerRecord]:
    """Read the record file at ``path`` (ordered as in the file)."""
    return parse_record_text(read_text_file(path, RecordError, "record file"), path)


def _check_int(name: str, layer: str, value: int, bounds: tuple, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise RecordError(f"{name} must be an integer, got {value!r}", file=path, layer=layer)
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise RecordError(f"{name} {value} is out of range [{bounds[0]}, {bounds[1]}]",
                          file=path, layer=layer)
    return value


def format_record(records: Mapping[str, LayerRecord], path: str = "<record>") -> str:
    """The protobuf text of ``records`` (keys on one line; ``skip_fusion`` only when true)."""
    msg = pb.ScaleOffsetRecord()
    for name, r in records.items():
        entry = msg.record.add()
        entry.key = name
        v = entry.value
        if r.scale_d is not None:
            v.scale_d = float(r.scale_d)
        if r.offset_d is not None:
            v.offset_d = _check_int("offset_d", name, r.offset_d, _INT32, path)
        v.scale_w.extend(float(s) for s in r.scale_w)
        v.offset_w.extend(_check_int("offset_w", name, o, _INT32, path) for o in r.offset_w)
        v.shift_bit.extend(_check_int("shift_bit", name, s, _UINT32, path) for s in r.shift_bit)
        for key in ("channels", "height", "width"):
            if getattr(r, key) is not None:
                setattr(v, key, _check_int(key, name, getattr(r, key), _UINT32, path))
        if r.skip_fusion:
            v.skip_fusion = True
    from google.protobuf import text_format
    return text_format.MessageToString(msg)


def write_record(path: str, records: Mapping[str, LayerRecord]) -> None:
    """Write ``records`` to ``path`` atomically (temp file in the same folder + os.replace)."""
    atomic_write_text(path, format_record(records, path))


def empty_record(path: str) -> None:
    """Create or empty the record file (what ``init`` does)."""
    atomic_write_text(path, "")


def _existing(path: str) -> dict[str, LayerRecord]:
    return read_record(path) if os.path.exists(path) else {}


def write_weight_factors(path: str,
                         factors: Mapping[str, tuple[Sequence[float], Sequence[int]]],
                         skip_fusion: Iterable[str] = ()) -> None:
    """Merge weight factors ``{layer: (scale_w, offset_w)}`` into the record at ``path`` (created
    if missing), replacing those layers' previous weight factors; layers in ``skip_fusion`` get
    ``skip_fusion: true``. Read, update and rewrite atomically."""
    records = _existing(path)
    for name, (scale_w, offset_w) in factors.items():
        r = records.setdefault(name, LayerRecord())
        r.scale_w = [float(s) for s in scale_w]
        r.offset_w = [int(o) for o in offset_w]
    for name in skip_fusion:
        records.setdefault(name, LayerRecord()).skip_fusion = True
    write_record(path, records)


def merge_activation_factors(path: str,
                             factors: Mapping[str, tuple[float, int, int, int, int]]) -> None:
    """Merge activation factors ``{layer: (scale_d, offset_d, channels, height, width)}`` into
    the record at ``path`` (created if missing): existing entries keep their weight factors and
    order, new layers are appended. Read, update and rewrite atomically."""
    records = _existing(path)
    for name, (scale_d, offset_d, c, h, w) in factors.items():
        r = records.setdefault(name, LayerRecord())
        r.scale_d, r.offset_d = float(scale_d), offset_d
        r.channels, r.height, r.width = c, h, w
    write_record(path, records)


#: The name used in docs/design.md before this module existed.
merge_activation = merge_activation_factors
