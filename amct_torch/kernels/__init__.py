"""Compiled CPU kernels: an optional accelerator for a few named observer operations.

``amct_torch.algorithms`` holds every formula as torch code and never imports this package;
``amct_torch.calibration.backends`` asks ``backend()`` once for the CPU and falls back to the
torch formulas when it returns None. Layout: ``build.py`` compiles and verifies the library
(private cache, checksum, lock), ``native.py`` wraps each C entry point with checked
arguments, ``ops.py`` is the backend the observers call.
"""
from __future__ import annotations

from typing import Optional

from amct_torch.kernels.build import turned_off


def backend(fallback) -> Optional[object]:
    """The CPU backend built on the kernels (``fallback``: the torch backend it hands the
    rare batches the kernels do not take), or None when they are unavailable."""
    from amct_torch.kernels import native
    if native.library() is None:
        return None
    from amct_torch.kernels.ops import KernelBackend
    return KernelBackend(fallback)


def unavailable_reason() -> Optional[str]:
    """Why the kernels are not loaded (None when they are, or were not tried)."""
    from amct_torch.kernels import native
    return native.unavailable_reason()


__all__ = ["backend", "turned_off", "unavailable_reason"]
