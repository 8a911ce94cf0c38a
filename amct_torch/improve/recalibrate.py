"""AMCT's calibration run again on a changed copy of the fused model (for cross-layer
equalization, whose new weights need new ARQ factors and whose rescaled activations need new
IFMR/HFMG factors).

Why not the job's own path: that path fuses from the loaded model and calibrates
``graph.fused`` in place; equalization must leave the job's graph as it is (the default
result stays, the guard may choose it), so this runs the same steps -- ARQ on the copy's
weights, the observer plan, the calibration loop over the same batches -- on a shallow copy
of the graph holding the equalized model.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from amct_torch.record import LayerRecord, add_weight_factors, as_stored


def recalibrate(graph: Any, gm: fx.GraphModule, batches: Sequence[Any], device: torch.device,
                ifmr_mode: str = "streaming") -> dict[str, LayerRecord]:
    """The full record (weight and activation factors) of ``gm`` -- a changed copy of
    ``graph.fused`` -- calibrated as the job calibrated ``graph.fused``, over ``batches``."""
    from amct_torch.calibration.loop import run_calibration
    from amct_torch.steps import calibrated_records, start_calibration
    from amct_torch.steps.weights import weight_factors

    g = copy.copy(graph)
    g.config = copy.copy(graph.config)
    g.config.batch_num = len(batches)
    g.fused = gm.to(device)
    g.records = as_stored(add_weight_factors({}, weight_factors(gm, g.config.layers, graph.model_file),
                                             skip_fusion=graph.skip_fusion), None)
    g.session = None
    session = start_calibration(g, ifmr_mode=ifmr_mode, summaries=False)  # only the records are kept
    rest = run_calibration(g.fused, session, list(batches), device, quiet=True)
    for _ in rest:  # nothing is left over: every batch calibrates
        pass
    return calibrated_records(g)
