"""The workflow layer: the one-call job, the demo and the writing of a whole job's outputs.

Why a floor of its own: ``amct_torch.steps`` holds AMCT's steps over an in-memory graph and
record, and ``amct_torch.api`` gives them AMCT's file-based names; ``quantize`` runs the same
steps in memory with data loading, the calibration loop, the exporters, the per-layer report
and one output transaction (the record is written once, at commit). Nothing below imports
this package.
"""
from amct_torch.workflow.job import quantize, run
from amct_torch.workflow.options import QuantizeOptions
from amct_torch.workflow.result import QuantizeResult

__all__ = ["QuantizeOptions", "QuantizeResult", "quantize", "run"]
