"""``QuantGraph``: the in-memory state the AMCT steps pass along (AMCT's "graph").

Why one object: ``init`` returns it and every later call takes it, in AMCT's API as in the
one-call job; it carries the float model, the fused model, the calibration session and the
record as it grows (weight factors, then activation factors), so no step needs a file to
hand its result to the next.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from amct_torch.calibration.observer_plan import CalibGroup
from amct_torch.calibration.session import CalibrationSession
from amct_torch.config.layers import LayerInfo
from amct_torch.config.types import QuantConfig
from amct_torch.record.types import LayerRecord


@dataclass
class QuantGraph:
    """The model, its config and what the steps have computed so far.

    ``model``: the float graph as loaded; ``fused``: after BN fusion; ``session``: the running
    calibration; ``records``: the record in memory (as the file would hold it): weight factors
    after ``quantize_weights``, activation factors merged in when the calibration finishes;
    ``fused_layers``: kept layer -> the BN/Scale names it absorbed (for the quant info JSON);
    ``skip_fusion``: quantized layers the config left unfused; ``record_file``: where AMCT's
    API writes the record (None while the record lives only in memory, as in the one-call
    job until it commits)."""

    model_file: str
    weights_file: str
    config_file: str
    config: QuantConfig
    layers: list[LayerInfo]
    model: Any
    record_file: Optional[str] = None
    fused: Any = None
    session: Optional[CalibrationSession] = None
    records: dict[str, LayerRecord] = field(default_factory=dict)
    fused_layers: dict[str, list[str]] = field(default_factory=dict)
    skip_fusion: list[str] = field(default_factory=list)
    groups: list[CalibGroup] = field(default_factory=list)

    @property
    def quant_layers(self) -> list[str]:
        """Names of the layers that will be quantized (record keys, joint entries excluded)."""
        return self.config.enabled_layers()

    @property
    def joint_layers(self) -> list[str]:
        """Eltwise layers that get a joint activation factor (``joint_quant``)."""
        return [g.layers[0] for g in self.groups if g.joint]
