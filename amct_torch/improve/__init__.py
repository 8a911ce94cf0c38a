"""Improvements beyond AMCT's own algorithms (opt-in with ``--improve``): each changes the
quantized model's weights or factors to bring its outputs closer to the float model's.

Names are imported on first use (module ``__getattr__``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    **{n: "amct_torch.improve.pipeline" for n in ("improve_graph", "summary_line")},
    **{n: "amct_torch.improve.names" for n in ("IMPROVEMENTS", "improvement_list")},
}

__all__ = ["IMPROVEMENTS", "improve_graph", "improvement_list", "summary_line"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.improve.names import IMPROVEMENTS, improvement_list
    from amct_torch.improve.pipeline import improve_graph, summary_line
