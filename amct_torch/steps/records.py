"""The record steps: check a graph's record once, and write it.

Why here: whether the record came back from a file (AMCT's ``save_model``) or stayed in memory
(the one-call job), it is checked by the same rules, once, before any model is written from it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from amct_torch.errors import RecordError
from amct_torch.record import LayerRecord, validate_record, write_record
from amct_torch.steps.calibrate import finish_calibration
from amct_torch.steps.graph import QuantGraph


def check_records(graph: QuantGraph, records: Mapping[str, LayerRecord],
                  file: Optional[str]) -> dict[str, LayerRecord]:
    """``records`` of ``graph`` after calibration, refused (``RecordError`` naming ``file``
    and the layer) unless every quantized layer and joint Eltwise has its factors and every
    entry is valid for the model."""
    missing = [n for n in graph.quant_layers + sorted(graph.joint_layers)
               if n not in records or records[n].scale_d is None]
    if missing:
        seen = graph.session.batches_seen if graph.session is not None else 0
        raise RecordError(f"no activation factors for {len(missing)} quantized layer(s) "
                          f"(first: '{missing[0]}'): run the model returned by quantize_model on "
                          f"batch_num={graph.config.batch_num} batches first (ran {seen})",
                          file=file, layer=missing[0])
    validate_record(records, graph.layers, file)
    return dict(records)


def calibrated_records(graph: QuantGraph, file: Optional[str] = None) -> dict[str, LayerRecord]:
    """The record of a calibrated ``graph``: the session finished (``finish_calibration``)
    and its record checked (``check_records``, errors naming ``file``)."""
    return check_records(graph, finish_calibration(graph), file)


def write_records(records: Mapping[str, LayerRecord], path: str) -> None:
    """The record file at ``path`` (atomic; the text protobuf prints)."""
    write_record(path, records)
