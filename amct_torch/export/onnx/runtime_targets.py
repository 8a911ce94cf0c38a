"""The runtimes the QDQ model can be laid out for (``--onnx-target``), declared once.

Why a module of its own, without onnx or torch: the command lists the names in ``--help`` and
the options check them before anything heavy is imported; the exporter, the preflight and the
job read each target's fields here instead of testing its name. What each layout does:
``targets.py`` and docs/export.md, "Runtime targets"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["ONNX_TARGETS", "TARGETS", "Target", "get_target"]


@dataclass(frozen=True)
class Target:
    """What one runtime target fixes in the QDQ model (None: the caller's choice stands).
    ``rewritten``: the built model is rewritten for the runtime (``targets.apply``), which reads
    initializer values, so it is built whole; otherwise it is written as built, streamed from
    the arrays, and its float model can be written during calibration."""

    name: str
    activations: Optional[str]
    integer_ops: Optional[bool]
    symmetric: bool
    rewritten: bool

    @property
    def streamed(self) -> bool:
        """Written as built, one array at a time (no rewrite reads the whole model)."""
        return not self.rewritten

    def layout(self, activations: str, integer_ops: bool) -> tuple[str, bool]:
        """The activation type and whether the integer form is written: what this target
        fixes, else the caller's choice."""
        return (self.activations or activations,
                integer_ops if self.integer_ops is None else self.integer_ops)


#: every target by name; the first is the default
TARGETS = {
    "onnxruntime": Target("onnxruntime", None, None, symmetric=False, rewritten=False),
    "openvino": Target("openvino", "uint8", False, symmetric=False, rewritten=True),
    "tensorrt": Target("tensorrt", "int8", False, symmetric=True, rewritten=True),
}
#: the target names, the default first (``--onnx-target``'s choices)
ONNX_TARGETS = tuple(TARGETS)


def get_target(name: str) -> Target:
    """The target called ``name``; a ValueError lists the choices."""
    if name not in TARGETS:
        raise ValueError(f"onnx target must be one of {', '.join(TARGETS)}, got {name!r}")
    return TARGETS[name]
