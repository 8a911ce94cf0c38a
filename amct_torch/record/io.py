"""Reading and writing the record file (protobuf text ``ScaleOffsetRecord``).

Keys rendered across lines as in AMCT's documentation (``key: "`` / ``conv1`` / ``"``) are
read as ``conv1`` (see ``amct_torch.config.textproto``). Every write goes through a temporary
file in the same folder and ``os.replace``, so a crash never leaves a half-written record; the
merge functions read, update and rewrite the whole file that way.

The text is protobuf's own: protobuf parses it and prints it. A record is written once per
step that changes it (AMCT's API: after the weight factors and after the activation factors;
the one-call job: once, at commit) and read once per consumer, so no faster path is needed.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

import numpy as np
from google.protobuf import text_format

from amct_torch.arguments import checked, instance, path_arg
from amct_torch.config.textproto import parse_text_proto, read_text_file
from amct_torch.errors import RecordError
from amct_torch.files.atomic import atomic_write_text
from amct_torch.proto import scale_offset_record_pb2 as pb
from amct_torch.record.merge import ActivationFactors, add_activation_factors, add_weight_factors
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
        key = entry.key if entry.HasField("key") else None
        if not key:
            raise RecordError(f"record entry #{i + 1} has no key (layer name)", file=path)
        if key in out:
            raise RecordError("layer appears more than once in the record", file=path, layer=key)
        v = entry.value
        out[key] = LayerRecord(
            scale_d=float(v.scale_d) if v.HasField("scale_d") else None,
            offset_d=int(v.offset_d) if v.HasField("offset_d") else None,
            scale_w=[float(s) for s in v.scale_w], offset_w=[int(o) for o in v.offset_w],
            shift_bit=[int(s) for s in v.shift_bit],
            channels=int(v.channels) if v.HasField("channels") else None,
            height=int(v.height) if v.HasField("height") else None,
            width=int(v.width) if v.HasField("width") else None,
            skip_fusion=bool(v.skip_fusion))
    return out


@checked(path=path_arg)
def read_record(path: str) -> dict[str, LayerRecord]:
    """Read the record file at ``path`` (ordered as in the file)."""
    return parse_record_text(read_text_file(path, RecordError, "record file"), path)


def _check_int(name: str, layer: str, value: int, bounds: tuple, path: Optional[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise RecordError(f"{name} must be an integer, got {value!r}", file=path, layer=layer)
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise RecordError(f"{name} {value} is out of range [{bounds[0]}, {bounds[1]}]",
                          file=path, layer=layer)
    return value


def _check_ints(name: str, layer: str, values: Sequence[int], bounds: tuple,
                path: Optional[str]) -> list[int]:
    """``_check_int`` over a list, with a fast path for plain in-range Python ints."""
    values = list(values)
    if all(type(v) is int for v in values) and \
            (not values or (min(values) >= bounds[0] and max(values) <= bounds[1])):
        return values
    return [_check_int(name, layer, v, bounds, path) for v in values]


def _f32(values: list) -> list:
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float64).astype(np.float32).astype(np.float64).tolist()


def _stored(name: str, r: LayerRecord, path: Optional[str]) -> LayerRecord:
    dims = {k: None if getattr(r, k) is None else _check_int(k, name, getattr(r, k), _UINT32, path)
            for k in ("channels", "height", "width")}
    return LayerRecord(
        scale_d=None if r.scale_d is None else _f32([float(r.scale_d)])[0],
        offset_d=None if r.offset_d is None else _check_int("offset_d", name, r.offset_d, _INT32, path),
        scale_w=_f32([float(s) for s in r.scale_w]) if len(r.scale_w) else [],
        offset_w=_check_ints("offset_w", name, r.offset_w, _INT32, path),
        shift_bit=_check_ints("shift_bit", name, r.shift_bit, _UINT32, path),
        skip_fusion=bool(r.skip_fusion), **dims)


def as_stored(records: Mapping[str, LayerRecord], path: Optional[str] = None) -> dict[str, LayerRecord]:
    """``records`` as the file holds them, i.e. exactly what reading them back after
    ``write_record`` gives: integers range-checked (``RecordError`` naming ``path`` and the
    layer), floats made float32 (values beyond float32 become +-inf, as protobuf stores them).
    A record kept in memory goes through this so that it computes what the file would."""
    return {name: _stored(name, r, path) for name, r in records.items()}


def _message(records: Mapping[str, LayerRecord]) -> pb.ScaleOffsetRecord:
    msg = pb.ScaleOffsetRecord()
    for name, r in records.items():
        v = msg.record.add(key=name).value
        if r.scale_d is not None:
            v.scale_d = r.scale_d
        if r.offset_d is not None:
            v.offset_d = r.offset_d
        v.scale_w.extend(r.scale_w)
        v.offset_w.extend(r.offset_w)
        v.shift_bit.extend(r.shift_bit)
        for k in ("channels", "height", "width"):
            if getattr(r, k) is not None:
                setattr(v, k, getattr(r, k))
        if r.skip_fusion:
            v.skip_fusion = True
    return msg


def format_record(records: Mapping[str, LayerRecord], path: Optional[str] = None) -> str:
    """The protobuf text of ``records`` (keys on one line, UTF-8 kept; ``skip_fusion`` only
    when true)."""
    return text_format.MessageToString(_message(as_stored(records, path)), as_utf8=True)


@checked(path=path_arg, records=instance(Mapping, what="a mapping of layer name to LayerRecord"))
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
    write_record(path, add_weight_factors(_existing(path), factors, skip_fusion))


def merge_activation_factors(path: str, factors: Mapping[str, ActivationFactors]) -> None:
    """Merge activation factors ``{layer: (scale_d, offset_d, channels, height, width)}`` into
    the record at ``path`` (created if missing): existing entries keep their weight factors and
    order, new layers are appended. Read, update and rewrite atomically."""
    write_record(path, add_activation_factors(_existing(path), factors))
