"""The calibration steps: start (plan the observer groups, attach the session) and finish
(the activation factors merged with the weight factors into the in-memory record).

Why the merge happens in the session's ``on_finish``: AMCT's workflow finishes by itself on
the ``batch_num``-th forward of the user's loop, so the record must be complete at that
moment, whoever drives the batches; ``then`` lets AMCT's API write the file right there.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from amct_torch.calibration.observer_plan import build_plan
from amct_torch.calibration.session import CalibrationSession, Factors, group_summary
from amct_torch.config.types import LayerQuantConfig, QuantConfig
from amct_torch.record import LayerRecord, add_activation_factors, as_stored
from amct_torch.steps.graph import QuantGraph

log = logging.getLogger("amct_torch")


def joint_config(qc: QuantConfig) -> LayerQuantConfig:
    """Activation config of a joint Eltwise group: IFMR defaults, asymmetric as
    ``activation_offset`` (quant.cfg has no per-layer config for Eltwise)."""
    return LayerQuantConfig(asymmetric=qc.activation_offset)


def start_calibration(graph: QuantGraph, ifmr_mode: str = "streaming",
                      then: Optional[Callable[[dict[str, LayerRecord]], None]] = None,
                      summaries: bool = True) -> CalibrationSession:
    """Plan the groups and attach a session to ``graph.fused``. When it finishes, the
    activation factors are merged into ``graph.records`` and ``then(graph.records)`` runs;
    ``summaries``: keep the observers' summaries for a visual report (``CalibrationSession``)."""
    qc = graph.config
    graph.groups = build_plan(graph.fused, qc.layers, joint_quant=qc.joint_quant,
                              joint_config=joint_config(qc))
    for members in group_summary(graph.groups).values():
        log.info("layers %s read the same input with the same config: calibrated once", members)

    def merge(factors: Factors) -> None:
        graph.records = as_stored(add_activation_factors(graph.records, factors), graph.record_file)
        if then is not None:
            then(graph.records)

    graph.session = CalibrationSession(graph.fused, graph.groups, qc.batch_num, on_finish=merge,
                                       ifmr_mode=ifmr_mode, summaries=summaries)
    return graph.session


def finish_calibration(graph: QuantGraph) -> dict[str, LayerRecord]:
    """Finish the session (if the last batch has not already) and return the whole record:
    weight and activation factors of every quantized layer and joint Eltwise."""
    if graph.session is None:
        from amct_torch.errors import CalibrationError
        raise CalibrationError("the calibration was not started: run quantize_model first")
    graph.session.finish()
    return graph.records
