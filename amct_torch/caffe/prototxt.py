"""Protobuf text format for Caffe nets, tolerant of fields our schema does not know.

Why: real prototxts carry a Caffe fork's extra fields; they must not stop loading, and a model
read and written back must not lose them (``text_format.Parse`` fails on them or drops them).
One pass over the tokens walks the text against the message descriptors, cuts out every unknown
field (spaces in its place, so later line and column numbers stay exact) and records its text
with its path inside the enclosing ``LayerParameter`` or ``NetParameter`` (``amct_unknown_text``),
where it follows the layer through copies and the graph and is written back at its path, never
into a caffemodel. docs/caffe_format.md, "Unknown fields"."""
from __future__ import annotations

import re
import warnings
from typing import Optional

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf import text_format

UNKNOWN_FIELD = "amct_unknown_text"

_TOKEN = re.compile(
    r"""(?P<ws>\s+|\#[^\n]*)
      |(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      |(?P<word>[A-Za-z0-9_.+\-]+)
      |(?P<punct>[{}<>:\[\],;/])""",
    re.VERBOSE,
)
_CLOSE = {"{": "}", "<": ">", "[": "]"}


class _Abandon(Exception):
    """The tolerant pass met something it does not understand; text_format will report it."""


def _tokenize(text: str) -> list[tuple[str, str, int, int]]:
    """(kind, value, start, end) of every token, comments and whitespace left out."""
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Abandon()
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKEN is a named group
        if kind != "ws":
            out.append((kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return out


class _Walker:
    """Walks tokens against descriptors and collects the spans of unknown fields."""

    def __init__(self, tokens: list[tuple[str, str, int, int]]) -> None:
        self.t = tokens
        self.found: list[tuple[str, int, int]] = []  # (path, start, end)
        self.byte_numbers: list[tuple[int, int, int]] = []  # (start, end, byte value)

    def _tok(self, i: int) -> Optional[tuple[str, str, int, int]]:
        return self.t[i] if i < len(self.t) else None

    def _skip_value(self, i: int) -> int:
        """Index after one value (scalar, adjacent strings, {...}, <...> or [...])."""
        tok = self._tok(i)
        if tok is None:
            raise _Abandon()
        if tok[1] in _CLOSE and tok[0] == "punct":
            depth = 0
            while True:
                tok = self._tok(i)
                if tok is None:
                    raise _Abandon()
                if tok[0] == "punct" and tok[1] in "{<[":
                    depth += 1
                elif tok[0] == "punct" and tok[1] in "}>]":
                    depth -= 1
                    if depth == 0:
                        return i + 1
                i += 1
        if tok[0] == "str":
            while (t := self._tok(i)) is not None and t[0] == "str":
                i += 1
            return i
        if tok[0] == "word":
            return i + 1
        raise _Abandon()

    def _note_byte_number(self, i: int) -> None:
        """A bytes field written as an integer in [-128, 255] (``quant_param { offset: 253 }``,
        the form OpenCV's importer accepts where it rejects AMCT's one-byte string) is read as
        that one byte, so our own fake-quant models load back (see docs/export.md)."""
        tok = self._tok(i)
        if tok is None or tok[0] != "word" or not re.fullmatch(r"[+-]?\d+", tok[1]):
            return
        value = int(tok[1])
        if -128 <= value <= 255:
            self.byte_numbers.append((tok[2], tok[3], value & 0xFF))

    def walk(self, desc: _descriptor.Descriptor, i: int, path: str, closing: Optional[str]) -> int:
        counts: dict[str, int] = {}
        while True:
            tok = self._tok(i)
            if tok is None:
                if closing is None:
                    return i
                raise _Abandon()
            if tok[0] == "punct" and tok[1] == closing:
                return i + 1
            if tok[0] == "punct" and tok[1] in ";,":
                i += 1
                continue
            if tok[0] != "word":
                raise _Abandon()  # extensions "[...]" and the like: leave them to text_format
            name, start = tok[1], tok[2]
            i += 1
            nxt = self._tok(i)
            if nxt is not None and nxt[0] == "punct" and nxt[1] == ":":
                i += 1
            field = desc.fields_by_name.get(name)
            if field is None:
                end_i = self._skip_value(i)
                self.found.append((path, start, self.t[end_i - 1][3]))
                i = end_i
                continue
            if field.type == _descriptor.FieldDescriptor.TYPE_BYTES:
                self._note_byte_number(i)
            if field.type != _descriptor.FieldDescriptor.TYPE_MESSAGE:
                i = self._skip_value(i)
                continue
            tok = self._tok(i)
            if tok is None or tok[0] != "punct":
                raise _Abandon()
            if tok[1] in "{<":
                seg = f"{name}[{counts.get(name, 0)}]"
                counts[name] = counts.get(name, 0) + 1
                i = self.walk(field.message_type, i + 1, _join(path, seg), _CLOSE[tok[1]])
            elif tok[1] == "[":  # list of messages: name: [{...}, {...}]
                i += 1
                while True:
                    tok = self._tok(i)
                    if tok is None or tok[0] != "punct":
                        raise _Abandon()
                    if tok[1] == "]":
                        i += 1
                        break
                    if tok[1] == ",":
                        i += 1
                        continue
                    if tok[1] not in "{<":
                        raise _Abandon()
                    seg = f"{name}[{counts.get(name, 0)}]"
                    counts[name] = counts.get(name, 0) + 1
                    i = self.walk(field.message_type, i + 1, _join(path, seg), _CLOSE[tok[1]])
            else:
                raise _Abandon()


def _join(path: str, seg: str) -> str:
    if not seg:
        return path
    return seg if not path else f"{path}/{seg}"


def _normalize(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def strip_unknown_fields(text: str, desc: _descriptor.Descriptor) -> tuple[str, list[tuple[str, str]]]:
    """Cut the fields ``desc`` does not know out of ``text``.

    Returns the text with those fields blanked (same length, same line breaks) and the list of
    ``(path, field_text)``. If the text is not well-formed enough to walk, it is returned
    unchanged with no entries, so that ``text_format`` reports the syntax error itself.
    """
    try:
        walker = _Walker(_tokenize(text))
        walker.walk(desc, 0, "", None)
    except (_Abandon, RecursionError):
        return text, []
    chars = list(text)
    entries = []
    for path, start, end in walker.found:
        entries.append((path, _normalize(text[start:end])))
        for k in range(start, end):
            if chars[k] != "\n":
                chars[k] = " "
    for start, end, value in walker.byte_numbers:  # one line each: line numbers stay exact
        chars[start:end] = [f'"\\{value:03o}"'] + [""] * (end - start - 1)
    return "".join(chars), entries


def attach_unknown(net: _message.Message, entries: list[tuple[str, str]]) -> None:
    """Store entries in the innermost ``layer[i]`` (path made relative) or on the net.

    Entries are kept in a stable order by path (text order within one path), so a net read,
    written and read again compares equal to the first read."""
    for path, text in sorted(entries, key=lambda e: e[0]):
        m = re.match(r"layer\[(\d+)\](?:/(.*))?$", path)
        if m is not None and int(m.group(1)) < len(net.layer):
            getattr(net.layer[int(m.group(1))], UNKNOWN_FIELD).append(f"{m.group(2) or ''}\n{text}")
        else:
            getattr(net, UNKNOWN_FIELD).append(f"{path}\n{text}")


def _split(entry: str) -> tuple[str, str]:
    path, _, text = entry.partition("\n")
    return path, text


def clear_unknown(net: _message.Message) -> None:
    """Remove the internal fields (the unknown-text entries; a renamed layer's user name is put
    back as its name: ``duplicate_names.py``) before writing."""
    from amct_torch.caffe.duplicate_names import restore_user_name
    net.ClearField(UNKNOWN_FIELD)
    for layer in net.layer:
        layer.ClearField(UNKNOWN_FIELD)
        restore_user_name(layer)


_OPEN_LINE = re.compile(r"^(\s*)([A-Za-z_]\w*) [{<]$")
_CLOSE_LINE = re.compile(r"^\s*[}>]$")


def to_text(net: _message.Message) -> str:
    """Text format of ``net`` with the recorded unknown fields put back in their blocks."""
    wanted: dict[str, list[str]] = {}
    for entry in getattr(net, UNKNOWN_FIELD):
        path, text = _split(entry)
        wanted.setdefault(path, []).append(text)
    for i, layer in enumerate(net.layer):
        for entry in getattr(layer, UNKNOWN_FIELD):
            path, text = _split(entry)
            wanted.setdefault(_join(f"layer[{i}]", path), []).append(text)
    clean = type(net)()
    clean.CopyFrom(net)
    clear_unknown(clean)
    body = text_format.MessageToString(clean, as_utf8=True)
    if not wanted:
        return body
    out: list[str] = []
    stack: list[tuple[str, str, dict[str, int]]] = [("", "", {})]  # (path, indent, counts)
    for line in body.splitlines():
        m = _OPEN_LINE.match(line)
        if m is not None:
            path, _, counts = stack[-1]
            name = m.group(2)
            seg = f"{name}[{counts.get(name, 0)}]"
            counts[name] = counts.get(name, 0) + 1
            stack.append((_join(path, seg), m.group(1) + "  ", {}))
        elif _CLOSE_LINE.match(line) and len(stack) > 1:
            path, indent, _ = stack.pop()
            for text in wanted.pop(path, []):
                out.extend(indent + part for part in text.splitlines())
        out.append(line)
    for text in wanted.pop("", []):
        out.extend(text.splitlines())
    for path in wanted:
        warnings.warn(f"unknown prototxt fields at '{path}' dropped: the block they were in is gone", stacklevel=2)
    return "\n".join(out) + "\n"


def find_nan(msg: _message.Message, path: str = "") -> Optional[str]:
    """The path of the first float field holding NaN in ``msg`` (``layer[3]/batch_norm_param/
    eps``), or None. A NaN parameter is never meaningful and only shows up later as NaN
    activations blamed on the data."""
    import math
    for field, value in msg.ListFields():
        where = f"{path}/{field.name}" if path else field.name
        repeated = field.is_repeated
        if field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE:
            for i, item in enumerate(value if repeated else [value]):
                found = find_nan(item, f"{where}[{i}]" if repeated else where)
                if found:
                    return found
        elif field.type in (_descriptor.FieldDescriptor.TYPE_FLOAT, _descriptor.FieldDescriptor.TYPE_DOUBLE) \
                and any(math.isnan(v) for v in (value if repeated else [value])):
            return where
    return None


def refuse_nan(net: _message.Message, file: str) -> None:
    """``ModelError`` naming the file and layer when a float parameter of ``net`` is NaN."""
    from amct_torch.errors import ModelError
    where = find_nan(net)
    if where is None:
        return
    m = re.match(r"layer\[(\d+)\]", where)
    layer = net.layer[int(m.group(1))].name if m and int(m.group(1)) < len(net.layer) else None
    raise ModelError(f"parameter {where} is NaN", file=file, layer=layer)
