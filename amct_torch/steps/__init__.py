"""The AMCT steps over an in-memory graph and record.

``load`` (model + JSON config) -> ``quantize_weights`` (BN fusion + ARQ weight factors) ->
``start_calibration`` (observers on the fused model) -> ``finish_calibration`` (activation
factors merged with the weight factors into ``{layer: LayerRecord}``) -> ``check_records``
(``calibrated_records``: those two in one call) -> ``write_records``. ``amct_torch.api``
gives them AMCT's file-based names (the record file written where and when AMCT writes it);
the one-call job in ``amct_torch.workflow`` runs them in memory and writes the record once,
at commit. Nothing here imports either.
"""
from amct_torch.steps.calibrate import finish_calibration, joint_config, start_calibration
from amct_torch.steps.graph import QuantGraph
from amct_torch.steps.load import check_finite_weights, load
from amct_torch.steps.records import calibrated_records, check_records, write_records
from amct_torch.steps.weights import fuse, quantize_weights, weight_factors

__all__ = ["QuantGraph", "calibrated_records", "check_finite_weights", "check_records", "finish_calibration", "fuse",
           "joint_config", "load", "quantize_weights", "start_calibration", "weight_factors",
           "write_records"]
