"""The workflow layer: the one-call job, the demo and the writing of a whole job's outputs.

Why a floor of its own: ``amct_torch.api`` is AMCT's step-by-step API (init, quantize_model,
save_model…); ``quantize`` strings those steps together with data loading, the calibration
loop, the per-layer report and one output transaction. It sits above the API and imports
it; nothing below imports this package.
"""
from amct_torch.workflow.job import quantize, run
from amct_torch.workflow.options import QuantizeOptions
from amct_torch.workflow.result import QuantizeResult

__all__ = ["QuantizeOptions", "QuantizeResult", "quantize", "run"]
