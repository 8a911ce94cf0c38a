"""A fast path for the record's protobuf text, for records of thousands of layers.

protobuf's pure-Python text parser and printer need about a second for a record of 1,000
layers with 64 per-channel scales each; calibration rewrites the record after every merge, so
this module reads and writes the plain layout directly:

- ``format_records`` prints exactly what ``text_format.MessageToString`` prints for the same
  ``ScaleOffsetRecord`` (same field order, same escaping, same shortest float32 digits); the
  tests compare the two.
- ``parse_records`` accepts the common layout (``record { key: "..." value { name: number } }``,
  any whitespace, optional ``:`` before ``{``) and returns ``None`` for anything else — comments,
  escapes, list syntax, hex/octal, inf/nan, out-of-range numbers, unknown fields, syntax errors
  — so the caller falls back to protobuf, which then gives the same result or the precise error.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np
from google.protobuf import text_encoding

from amct_torch.record.types import LayerRecord

_FLOAT1 = r"-?(?:(?:0|[1-9]\d*)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_INT1 = r"-?(?:0|[1-9]\d*)"
# One regex call checks a whole list (values joined by newlines).
_FLOATS = re.compile(rf"(?:{_FLOAT1}\n)*{_FLOAT1}")
_INTS = re.compile(rf"(?:{_INT1}\n)*{_INT1}")
# One entry in the usual layout: key first, then a flat value block.
_ENTRY = re.compile(r'record\s*:?\s*\{\s*key\s*:\s*"([^"\\\n]*)"\s*value\s*:?\s*\{([^{}"]*)\}\s*\}')
_PAIR = re.compile(r'([A-Za-z_]\w*)\s*:\s*([^\s{}:"]+)')
_SINGULAR = ("scale_d", "offset_d", "channels", "height", "width", "skip_fusion")
_UNSAFE = re.compile(r"[#'<>\[\];,\\]")
_FLOAT_FIELDS = ("scale_d", "scale_w")
_INT_FIELDS = {"offset_d": (-2 ** 31, 2 ** 31 - 1), "offset_w": (-2 ** 31, 2 ** 31 - 1),
               "shift_bit": (0, 2 ** 32 - 1), "channels": (0, 2 ** 32 - 1),
               "height": (0, 2 ** 32 - 1), "width": (0, 2 ** 32 - 1)}
_REPEATED = ("scale_w", "offset_w", "shift_bit")


def _to_f32(values: list) -> Optional[list]:
    """Decimal strings -> Python floats holding the float32 value (double, then float32, as
    protobuf does); None if a value overflows float32 (left to protobuf)."""
    with np.errstate(over="ignore"):
        arr = np.array(values, dtype=np.float64).astype(np.float32)
    if not np.isfinite(arr).all():
        return None
    return arr.astype(np.float64).tolist()


def parse_records(text: str) -> Optional[list]:
    """``[(key, LayerRecord)]`` in file order, or None when this fast path does not apply (see
    the module docstring). Repeated singular fields keep the last value, as protobuf's merge
    does."""
    if _UNSAFE.search(text):
        return None
    entries: list = []
    pos = 0
    for m in _ENTRY.finditer(text):
        if text[pos:m.start()].strip():
            return None
        pos = m.end()
        body = m.group(2)
        pairs = _PAIR.findall(body)
        if len(pairs) != body.count(":") or _PAIR.sub("", body).strip():
            return None
        fields: dict = {}
        for name, val in pairs:
            if name in _REPEATED:
                fields.setdefault(name, []).append(val)
            elif name in _SINGULAR:
                fields[name] = val
            else:
                return None
        entries.append((m.group(1), fields))
    if text[pos:].strip():
        return None
    return _convert(entries)


def _convert(entries: list) -> Optional[list]:
    result = []
    for key, f in entries:
        r = LayerRecord()
        for name, bounds in _INT_FIELDS.items():
            if name not in f:
                continue
            vals = f[name] if name in _REPEATED else [f[name]]
            if not _INTS.fullmatch("\n".join(vals)) or max(len(v) for v in vals) > 24:
                return None  # protobuf reports it (an int of thousands of digits included)
            ints = [int(v) for v in vals]
            if min(ints) < bounds[0] or max(ints) > bounds[1]:
                return None
            setattr(r, name, ints if name in _REPEATED else ints[0])
        for name in _FLOAT_FIELDS:
            if name not in f:
                continue
            vals = f[name] if name == "scale_w" else [f[name]]
            if not _FLOATS.fullmatch("\n".join(vals)):
                return None
            floats = _to_f32(vals)
            if floats is None:
                return None
            setattr(r, name, floats if name == "scale_w" else floats[0])
        if "skip_fusion" in f:
            if f["skip_fusion"] not in ("true", "false"):
                return None
            r.skip_fusion = f["skip_fusion"] == "true"
        result.append((key, r))
    return result


def _shortest_f32(values: list) -> list:
    """protobuf's printing of float fields, vectorised: the value rounded to the fewest
    significant digits (6..9) that still give the same float32, printed as a Python float
    (``0.01424``, ``123456790.0``, ``-0.0``, ``inf``, ``nan``)."""
    arr = np.asarray(values, dtype=np.float64).astype(np.float32)
    f64 = arr.astype(np.float64).tolist()
    rounded = [float("%.6g" % v) for v in f64]
    for precision in (7, 8, 9, 10):
        back = np.array(rounded, dtype=np.float64).astype(np.float32)
        bad = np.flatnonzero(~((back == arr) | np.isnan(arr)))
        if bad.size == 0:
            break
        for j in bad.tolist():
            rounded[j] = float("%.*g" % (precision, f64[j]))
    return [str(v) for v in rounded]


#: the weight part of a block (its scale_w/offset_w/shift_bit lines) by value: calibration
#: writes the weight factors first and rewrites the record once the activation factors are
#: merged in, with every block changed (scale_d) but the weight lines the same; their
#: shortest-digit formatting is most of the cost (~25 ms for nsfw's 13k values)
_WEIGHT_LINES: dict = {}
_WEIGHT_LINES_MAX = 100_000


def _weight_key(r: LayerRecord) -> tuple:
    """Everything the weight lines depend on; floats by their bits (0.0 and -0.0 print
    differently but compare equal)."""
    return (np.asarray(r.scale_w, dtype=np.float64).tobytes(), tuple(r.offset_w), tuple(r.shift_bit))


def format_records(records: Mapping[str, LayerRecord]) -> str:
    """The protobuf text of ``records`` (values already range-checked by the caller)."""
    wkeys = [_weight_key(r) for r in records.values()]
    todo = {k: r for k, r in zip(wkeys, records.values()) if k not in _WEIGHT_LINES}
    floats = [r.scale_d for r in records.values() if r.scale_d is not None]
    for r in todo.values():
        floats.extend(r.scale_w)
    texts = iter(_shortest_f32(floats) if floats else [])
    scale_d = {name: next(texts) for name, r in records.items() if r.scale_d is not None}
    if len(_WEIGHT_LINES) + len(todo) > _WEIGHT_LINES_MAX:
        _WEIGHT_LINES.clear()
    for k, r in todo.items():
        _WEIGHT_LINES[k] = _weight_lines(r, texts)
    return "".join(_block(name, r, scale_d.get(name), _WEIGHT_LINES[k])
                   for (name, r), k in zip(records.items(), wkeys))


def _weight_lines(r: LayerRecord, texts) -> str:
    """The scale_w (digits from ``texts``, in order), offset_w and shift_bit lines of a block."""
    parts = ["    scale_w: %s\n" % next(texts) for _ in range(len(r.scale_w))]
    parts.extend("    offset_w: %d\n" % int(o) for o in r.offset_w)
    parts.extend("    shift_bit: %d\n" % int(s) for s in r.shift_bit)
    return "".join(parts)


def _block(name: str, r: LayerRecord, scale_d: Optional[str], weight_lines: str) -> str:
    """One ``record { ... }`` entry, in protobuf's field order."""
    parts: list[str] = ['record {\n  key: "%s"\n  value {\n' % text_encoding.CEscape(name, as_utf8=True)]
    if scale_d is not None:
        parts.append("    scale_d: %s\n" % scale_d)
    if r.offset_d is not None:
        parts.append("    offset_d: %d\n" % int(r.offset_d))
    parts.append(weight_lines)
    for key in ("channels", "height", "width"):
        v = getattr(r, key)
        if v is not None:
            parts.append("    %s: %d\n" % (key, int(v)))
    if r.skip_fusion:
        parts.append("    skip_fusion: true\n")
    parts.append("  }\n}\n")
    return "".join(parts)
