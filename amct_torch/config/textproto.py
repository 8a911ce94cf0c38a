"""Protobuf text parsing for the user's quant.cfg and record files, with readable errors.

AMCT's own documentation renders quoted strings across three lines (``key: "`` / ``conv1`` /
``"``), and users copy those examples. Protobuf's text tokenizer refuses a line break inside a
string, so before parsing, every quoted string that spans lines is joined: its content is
stripped of the surrounding whitespace and line breaks (``"\\nconv1\\n"`` -> ``"conv1"``). The
removed line breaks are put back right after the closing quote, so line numbers in error
messages still point at the user's file. Single-line strings are left exactly as written.
"""
from __future__ import annotations

import difflib
import re
from typing import Optional, TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from amct_torch.errors import AmctError
from amct_torch.inputs.limits import check_regular_file

M = TypeVar("M", bound=Message)


_STOP = {'"': re.compile(r'["\\]'), "'": re.compile(r"['\\]")}
_START = re.compile(r"""[#"']""")


def _literal_end(text: str, start: int) -> int:
    """Index after the quoted string opening at ``start``, or -1 when it never closes.
    One forward pass, no backtracking: linear in the length of the string."""
    stop = _STOP[text[start]]
    i = start + 1
    while True:
        m = stop.search(text, i)
        if m is None:
            return -1
        if m.group() == "\\":
            i = m.end() + 1
        else:
            return m.end()


def _join(lit: str) -> str:
    if "\n" not in lit:
        return lit
    body = lit[1:-1]
    if "\n" in body.strip():
        return lit
    return lit[0] + body.strip() + lit[0] + "\n" * body.count("\n")


def join_multiline_strings(text: str) -> str:
    """Return ``text`` with every quoted string that spans lines joined onto one line.

    Comments (``#`` to end of line, outside strings) are kept verbatim. A string whose content
    still contains a line break after stripping (a break *inside* a name) is left alone, so the
    protobuf parser reports it at its line. A string that never closes ends the scan (the
    parser reports it). The scan is one linear pass (a regular expression backtracked
    quadratically on a quote followed by many escaped quotes).
    """
    if "\n" not in text or ('"' not in text and "'" not in text):
        return text
    out = []
    i = 0
    n = len(text)
    while i < n:
        m = _START.search(text, i)
        if m is None:
            out.append(text[i:])
            break
        j = m.start()
        out.append(text[i:j])
        if text[j] == "#":
            end = text.find("\n", j)
            end = n if end < 0 else end
            out.append(text[j:end])
        else:
            end = _literal_end(text, j)
            if end < 0:
                out.append(text[j:])
                break
            out.append(_join(text[j:end]))
        i = end
    return "".join(out)


def _field_names(message_type) -> list[str]:
    return [f.name for f in message_type.fields]


def _hint(err: text_format.ParseError, lines: list[str], root: Message) -> str:
    """A suggestion for an unknown field: a close field name, or a word split across lines."""
    msg = str(err)
    marker = 'has no field named "'
    if marker not in msg:
        return ""
    name = msg.split(marker, 1)[1].split('"', 1)[0]
    mtype = msg.split('Message type "', 1)[1].split('"', 1)[0] if 'Message type "' in msg else ""
    names = _all_field_names(root.DESCRIPTOR, mtype)
    line = err.GetLine() if err.GetLine() else 0
    if 0 < line < len(lines):
        nxt = lines[line].strip().split(":")[0].split("{")[0].strip()
        if nxt and (name + nxt) in names:
            return (f" The word '{name + nxt}' seems to be split across lines {line} and "
                    f"{line + 1}: write '{name + nxt}' on one line.")
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return f" Did you mean '{close[0]}'?"
    if names:
        return f" Known fields here: {', '.join(names)}."
    return ""


def _all_field_names(descriptor, full_name: str) -> list[str]:
    """Field names of the message type ``full_name`` reachable from ``descriptor``."""
    seen = set()
    stack = [descriptor]
    while stack:
        d = stack.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        if d.full_name == full_name:
            return _field_names(d)
        for f in d.fields:
            if f.message_type is not None:
                stack.append(f.message_type)
    return []


def parse_text_proto(text: str, message_cls: type[M], path: str, error_cls: type[AmctError],
                     what: str) -> M:
    """Parse protobuf ``text`` into a new ``message_cls``; any problem raises ``error_cls``
    naming ``path`` and the line.

    Merge semantics are used (as AMCT does): a repeated scalar keeps the last value, and of two
    activation algorithms in one config (a oneof) the last one wins. Required fields are
    checked after parsing.
    """
    fixed = join_multiline_strings(text)
    msg = message_cls()
    try:
        text_format.Merge(fixed, msg)
    except text_format.ParseError as err:
        line: Optional[int] = err.GetLine() or None
        raw = str(err)
        # protobuf prefixes "line:col : "; the line goes into our own location prefix.
        detail = raw.split(" : ", 1)[1] if " : " in raw[:20] else raw
        raise error_cls(f"cannot parse {what}: {detail}.{_hint(err, fixed.split(chr(10)), msg)}"
                        .replace("..", "."), file=path, line=line) from None
    except (ValueError, TypeError, UnicodeError) as err:  # e.g. invalid escapes
        raise error_cls(f"cannot parse {what}: {err}", file=path) from None
    missing = msg.FindInitializationErrors()
    if missing:
        raise error_cls(f"{what} is missing required field(s): {', '.join(missing)}", file=path)
    return msg


def read_text_file(path: str, error_cls: type[AmctError], what: str) -> str:
    """Read a user's text file; missing files and bad encodings become ``error_cls``."""
    check_regular_file(path, what, error_cls)  # a FIFO or device would block the read
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise error_cls(f"{what} not found", file=path) from None
    except UnicodeDecodeError as err:
        raise error_cls(f"{what} is not UTF-8 text ({err.reason} at byte {err.start})",
                        file=path) from None
    except OSError as err:
        raise error_cls(f"cannot read {what}: {err.strerror}", file=path) from None
