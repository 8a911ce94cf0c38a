"""A package's public names imported on first use (module ``__getattr__``, PEP 562).

Why: importing ``amct_torch`` (or ``amct_torch.caffe`` for its file readers) must not import
torch, ONNX or OpenCV -- ``amct-torch --help`` answers without them, and the command reads
the caffemodel while torch is still being imported. Each name is imported from the module
that defines it when first read, then kept in the package's namespace.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable

__all__ = ["lazy_names"]


def lazy_names(package: str, modules: Mapping[str, str],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose names ``modules`` maps to the module
    defining each; ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(modules))

    return __getattr__, __dir__
