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

# Every non-space character lands in some token (a lone quote is its own token), so nothing is
# skipped silently.
_TOKEN = re.compile(r'"[^"\\\n]*"|[{}:]|[^\s{}:"]+|"')
_FLOAT1 = r"-?(?:(?:0|[1-9]\d*)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_INT1 = r"-?(?:0|[1-9]\d*)"
# One regex call checks a whole list (values joined by newlines).
_FLOATS = re.compile(rf"(?:{_FLOAT1}\n)*{_FLOAT1}")
_INTS = re.compile(rf"(?:{_INT1}\n)*{_INT1}")
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
    """``[(key or None, LayerRecord)]`` in file order, or None when this fast path does not
    apply (see the module docstring). Repeated singular fields keep the last value, as
    protobuf's merge does."""
    if _UNSAFE.search(text):
        return None
    toks = _TOKEN.findall(text)
    out: list = []
    i, n = 0, len(toks)
    try:
        while i < n:
            if toks[i] != "record":
                return None
            i += 1
            if toks[i] == ":":
                i += 1
            if toks[i] != "{":
                return None
            i += 1
            key, fields = None, None
            while toks[i] != "}":
                name = toks[i]
                if name == "key":
                    tok = toks[i + 2]
                    if toks[i + 1] != ":" or len(tok) < 2 or tok[0] != '"' or tok[-1] != '"':
                        return None
                    key = tok[1:-1]
                    i += 3
                elif name == "value":
                    i += 1
                    if toks[i] == ":":
                        i += 1
                    if toks[i] != "{":
                        return None
                    i += 1
                    fields = {} if fields is None else fields
                    while toks[i] != "}":
                        fname, colon, val = toks[i], toks[i + 1], toks[i + 2]
                        if colon != ":":
                            return None
                        if fname in _REPEATED:
                            fields.setdefault(fname, []).append(val)
                        elif fname in _INT_FIELDS or fname in ("scale_d", "skip_fusion"):
                            fields[fname] = val
                        else:
                            return None
                        i += 3
                    i += 1
                else:
                    return None
            i += 1
            out.append((key, fields or {}))
    except IndexError:
        return None
    return _convert(out)


def _convert(entries: list) -> Optional[list]:
    result = []
    for key, f in entries:
        r = LayerRecord()
        for name, bounds in _INT_FIELDS.items():
            if name not in f:
                continue
            vals = f[name] if name in _REPEATED else [f[name]]
            if not _INTS.fullmatch("\n".join(vals)):
                return None
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


def format_records(records: Mapping[str, LayerRecord]) -> str:
    """The protobuf text of ``records`` (values already range-checked by the caller)."""
    parts: list[str] = []
    for name, r in records.items():
        parts.append('record {\n  key: "%s"\n  value {\n'
                     % text_encoding.CEscape(name, as_utf8=True))
        if r.scale_d is not None:
            parts.append("    scale_d: %s\n" % _shortest_f32([r.scale_d])[0])
        if r.offset_d is not None:
            parts.append("    offset_d: %d\n" % int(r.offset_d))
        if r.scale_w:
            parts.extend("    scale_w: %s\n" % s for s in _shortest_f32(list(r.scale_w)))
        parts.extend("    offset_w: %d\n" % int(o) for o in r.offset_w)
        parts.extend("    shift_bit: %d\n" % int(s) for s in r.shift_bit)
        for key in ("channels", "height", "width"):
            v = getattr(r, key)
            if v is not None:
                parts.append("    %s: %d\n" % (key, int(v)))
        if r.skip_fusion:
            parts.append("    skip_fusion: true\n")
        parts.append("  }\n}\n")
    return "".join(parts)
