"""Prototxt fields the schema does not know: listed, and refused unless the user allows them.

Why: a Caffe fork's field on a known layer (``pooling_param { ceil_mode: false }`` before it
was read) can change what the layer computes, so a net run without it may be silently a
different network. The reader keeps such fields as text (``prototxt.py``); ``inspect`` lists
each with its layer, and building a model from a net that has any is refused (``ModelError``
naming file, layer and field) unless allowed: ``allow_unknown_fields=True`` in the Python API,
``--allow-unknown-fields`` on the command line (both set ``unknown_fields_allowed``).
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

from amct_torch.caffe.prototxt import UNKNOWN_FIELD
from amct_torch.errors import ModelError

__all__ = ["UnknownField", "allow_unknown_fields", "allowed", "refuse_unknown_fields", "unknown_fields",
           "unknown_fields_allowed"]

_ALLOW: contextvars.ContextVar[bool] = contextvars.ContextVar("amct_allow_unknown_fields", default=False)


@dataclass(frozen=True)
class UnknownField:
    """One unknown field: its layer (None outside any layer), the block holding it
    (``pooling_param``, ``param[1]``; empty for the layer itself), its name and its text."""

    layer: Optional[str]
    block: str
    field: str
    text: str

    def where(self) -> str:
        """``pooling_param.ceil_mode`` (the block, then the field)."""
        return f"{self.block}.{self.field}" if self.block else self.field


def _block(path: str) -> str:
    """``pooling_param[0]/foo[0]`` -> ``pooling_param.foo``; other indices are kept."""
    return ".".join(re.sub(r"\[0\]$", "", seg) for seg in path.split("/") if seg)


def _entries(owner: Any, layer: Optional[str]) -> Iterator[UnknownField]:
    for entry in getattr(owner, UNKNOWN_FIELD):
        path, _, text = entry.partition("\n")
        name = re.match(r"[A-Za-z0-9_.+\-]*", text)
        yield UnknownField(layer, _block(path), name.group() if name else text, text)


def unknown_fields(net: Any) -> list[UnknownField]:
    """Every unknown field kept in ``net`` (a NetParameter read by ``netio``), layers first in
    the net's order, then those outside any layer."""
    out = [f for layer in net.layer for f in _entries(layer, layer.name)]
    return out + list(_entries(net, None))


def allowed() -> bool:
    """Whether the current context allows unknown fields (see ``unknown_fields_allowed``)."""
    return _ALLOW.get()


@contextlib.contextmanager
def unknown_fields_allowed(allow: bool = True) -> Iterator[None]:
    """Within the block, models are built from nets with unknown fields (``allow``) or not."""
    token = _ALLOW.set(bool(allow))
    try:
        yield
    finally:
        _ALLOW.reset(token)


def allow_unknown_fields(allow: bool) -> contextlib.AbstractContextManager[None]:
    """A call's own ``allow_unknown_fields`` argument: within the block unknown fields are
    allowed when ``allow`` is true or the enclosing block already allows them."""
    return unknown_fields_allowed(allow or allowed())


def refuse_unknown_fields(net: Any, file: Optional[str], allow: Optional[bool] = None) -> None:
    """``ModelError`` naming the file, the layer and the field of the first unknown field of
    ``net``, unless ``allow`` (None: the context's setting, ``unknown_fields_allowed``)."""
    if allow if allow is not None else _ALLOW.get():
        return
    found = unknown_fields(net)
    if not found:
        return
    f = found[0]
    more = f" (and {len(found) - 1} more, listed by 'amct-torch inspect')" if len(found) > 1 else ""
    raise ModelError(f"unknown field '{f.where()}'{more}: this tool does not read it, so the layer "
                     f"may compute other numbers than the Caffe fork that wrote it; pass "
                     f"--allow-unknown-fields (Python: allow_unknown_fields=True) to run it without "
                     f"the field", file=file, layer=f.layer)
