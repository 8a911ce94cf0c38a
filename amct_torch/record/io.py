"""Reading and writing the record file (protobuf text ``ScaleOffsetRecord``).

Keys rendered across lines as in AMCT's documentation (``key: "`` / ``conv1`` / ``"``) are
read as ``conv1`` (see ``amct_torch.config.textproto``). Every write goes through a temporary
file in the same folder and ``os.replace``, so a crash never leaves a half-written record; the
merge functions read, update and rewrite the whole file that way.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from amct_torch.config.textproto import (join_multiline_strings, parse_text_proto,
                                       read_text_file)
from amct_torch.errors import RecordError
from amct_torch.proto import scale_offset_record_pb2 as pb
from amct_torch.record import fasttext
from amct_torch.atomic import atomic_write_text
from amct_torch.record.types import LayerRecord

_INT32 = (-2 ** 31, 2 ** 31 - 1)
_UINT32 = (0, 2 ** 32 - 1)


def parse_record_text(text: str, path: str = "<record>") -> dict[str, LayerRecord]:
    """Parse record ``text`` into ``{layer name: LayerRecord}`` in file order.

    Syntax errors, an entry without key and a key given twice raise ``RecordError`` naming
    ``path``. An empty text gives an empty dict (``validate_record`` refuses that). The plain
    layout is read by a fast path (``fasttext``); anything else goes through protobuf.
    """
    entries = fasttext.parse_records(join_multiline_strings(text))
    if entries is None:
        entries = _parse_with_protobuf(text, path)
    out: dict[str, LayerRecord] = {}
    for i, (key, rec) in enumerate(entries):
        if not key:
            raise RecordError(f"record entry #{i + 1} has no key (layer name)", file=path)
        if key in out:
            raise RecordError("layer appears more than once in the record", file=path, layer=key)
        out[key] = rec
    return out


def _parse_with_protobuf(text: str, path: str) -> list:
    msg = parse_text_proto(text, pb.ScaleOffsetRecord, path, RecordError, "record file")
    entries = []
    for entry in msg.record:
        v = entry.value
        entries.append((entry.key if entry.HasField("key") else None, LayerRecord(
            scale_d=float(v.scale_d) if v.HasField("scale_d") else None,
            offset_d=int(v.offset_d) if v.HasField("offset_d") else None,
            scale_w=[float(s) for s in v.scale_w], offset_w=[int(o) for o in v.offset_w],
            shift_bit=[int(s) for s in v.shift_bit],
            channels=int(v.channels) if v.HasField("channels") else None,
            height=int(v.height) if v.HasField("height") else None,
            width=int(v.width) if v.HasField("width") else None,
            skip_fusion=bool(v.skip_fusion))))
    return entries


#: the records this process last wrote, per path, with the file's identity then: a
#: calibration rewrites the record after each merge and need not parse back what it just
#: wrote (~40 ms for nsfw's 13k per-channel factors). Any change to the file (size, mtime,
#: inode) makes the file be read again.
_written: dict = {}


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _copy(records: Mapping[str, LayerRecord]) -> dict[str, LayerRecord]:
    return {k: dataclasses.replace(r, scale_w=list(r.scale_w), offset_w=list(r.offset_w),
                                   shift_bit=list(r.shift_bit)) for k, r in records.items()}


def read_record(path: str) -> dict[str, LayerRecord]:
    """Read the record file at ``path`` (ordered as in the file)."""
    cached = _written.get(os.path.abspath(path))
    if cached is not None:
        try:
            if _identity(path) == cached[0]:
                return _copy(cached[1])
        except OSError:
            pass
    return parse_record_text(read_text_file(path, RecordError, "record file"), path)


def _check_int(name: str, layer: str, value: int, bounds: tuple, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise RecordError(f"{name} must be an integer, got {value!r}", file=path, layer=layer)
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise RecordError(f"{name} {value} is out of range [{bounds[0]}, {bounds[1]}]",
                          file=path, layer=layer)
    return value


def _checked(name: str, r: LayerRecord, path: str) -> LayerRecord:
    """A copy of ``r`` with integers range-checked and floats made float32, as the file holds
    them (values beyond float32 become +-inf, as protobuf stores them)."""
    def f32(values: list) -> list:
        with np.errstate(over="ignore"):
            return np.asarray(values, dtype=np.float64).astype(np.float32).astype(np.float64).tolist()

    dims = {k: None if getattr(r, k) is None else _check_int(k, name, getattr(r, k), _UINT32, path)
            for k in ("channels", "height", "width")}
    return LayerRecord(
        scale_d=None if r.scale_d is None else f32([float(r.scale_d)])[0],
        offset_d=None if r.offset_d is None else _check_int("offset_d", name, r.offset_d, _INT32, path),
        scale_w=f32([float(s) for s in r.scale_w]) if len(r.scale_w) else [],
        offset_w=_check_ints("offset_w", name, r.offset_w, _INT32, path),
        shift_bit=_check_ints("shift_bit", name, r.shift_bit, _UINT32, path),
        skip_fusion=bool(r.skip_fusion), **dims)


def _check_ints(name: str, layer: str, values: Sequence[int], bounds: tuple,
                path: str) -> list[int]:
    """``_check_int`` over a list, with a fast path for plain in-range Python ints."""
    values = list(values)
    if all(type(v) is int for v in values) and \
            (not values or (min(values) >= bounds[0] and max(values) <= bounds[1])):
        return values
    return [_check_int(name, layer, v, bounds, path) for v in values]


def format_record(records: Mapping[str, LayerRecord], path: str = "<record>") -> str:
    """The protobuf text of ``records``: exactly what protobuf's printer gives for the same
    message (keys on one line; ``skip_fusion`` only when true)."""
    return fasttext.format_records({name: _checked(name, r, path) for name, r in records.items()})


def write_record(path: str, records: Mapping[str, LayerRecord]) -> None:
    """Write ``records`` to ``path`` atomically (temp file in the same folder + os.replace)."""
    checked = {name: _checked(name, r, path) for name, r in records.items()}
    atomic_write_text(path, fasttext.format_records(checked))
    _written[os.path.abspath(path)] = (_identity(path), _copy(checked))


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
