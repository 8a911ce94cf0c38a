"""The workflow layer: the one-call job, the demo and the writing of a whole job's outputs.

Why a floor of its own: ``amct_torch.steps`` holds AMCT's steps over an in-memory graph and
record, and ``amct_torch.api`` gives them AMCT's file-based names; ``quantize`` runs the same
steps in memory with data loading, the calibration loop, the exporters, the per-layer report
and one output transaction (the record is written once, at commit). Nothing below imports
this package. Names are imported on first use, so that the command line reads the options'
declarations (``options.py``) without torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime import lazy_names

_LAZY = {"quantize": "amct_torch.workflow.job", "run": "amct_torch.workflow.job",
         "QuantizeOptions": "amct_torch.workflow.options", "QuantizeResult": "amct_torch.workflow.result",
         "run_demo": "amct_torch.workflow.demo",
         **{n: "amct_torch.workflow.option_declaration" for n in ("dest_of", "flags_of", "read_value")}}

__all__ = ["QuantizeOptions", "QuantizeResult", "dest_of", "flags_of", "quantize", "read_value", "run", "run_demo"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.workflow.demo import run_demo
    from amct_torch.workflow.job import quantize, run
    from amct_torch.workflow.option_declaration import dest_of, flags_of, read_value
    from amct_torch.workflow.options import QuantizeOptions
    from amct_torch.workflow.result import QuantizeResult
