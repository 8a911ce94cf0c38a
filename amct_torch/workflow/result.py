"""What the one-call job returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from amct_torch.steps import QuantGraph


@dataclass
class QuantizeResult:
    """What ``quantize`` produced.

    ``files``: kind → path of every file written (``record``, ``config``, ``fake_quant_model``,
    ``deploy_model``, ``onnx``, ``report``…); ``records``: the record as written (the values
    the file holds); ``float_model``/``quant_model``: the fused float torch model and its
    fake-quant twin (on ``device``); ``report``: per-layer ``LayerStat`` rows, worst first
    (None when not asked); ``graph``: the ``QuantGraph``."""

    files: dict[str, str]
    records: dict
    float_model: Any
    quant_model: Any
    graph: QuantGraph
    report: Optional[list] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: torch.distributed rank (0 without distributed); ranks > 0 write nothing (``files`` empty)
    rank: int = 0
    #: samples that calibrated, and samples in the data (None when the data is an iterable)
    samples_used: Optional[int] = None
    samples_total: Optional[int] = None
    #: an earlier run's files of the output prefix that this run does not write, removed
    removed: list[str] = field(default_factory=list)
    #: with ``improve``: what each improvement stage did and cost (``Improvement.summary()``)
    improvement: Optional[dict] = None
