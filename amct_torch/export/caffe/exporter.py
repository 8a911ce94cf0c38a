"""The Caffe exporter: the fake-quant and/or deploy Caffe models and the quant info JSON of
a calibrated graph, as ``save_type`` asks (AMCT's ``save_model`` files).

Why here: the one-call job (through the exporter interface), ``save_model`` and the accuracy
based auto calibration all write these files from a graph held in memory; this is the one
function they call. Torch is imported when writing, not when the class is read."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from amct_torch.export.caffe import SUFFIXES, model_kinds
from amct_torch.export.exporter import Exporter, ExportInputs

__all__ = ["CaffeExporter", "write_caffe_models"]


def write_caffe_models(graph: Any, records: Mapping[str, Any], save_type: str, prefix: str,
                       record_file: Optional[str] = None) -> dict[str, str]:
    """Write the models of ``save_type`` and the quant info JSON of a calibrated graph
    (``steps.QuantGraph``) from ``records`` under ``prefix``; returns kind -> path.
    ``record_file``: what the errors name (None: a record computed in memory)."""
    from amct_torch.export.convert import save_quant_models

    save_quant_models(graph.fused, records, save_type=save_type, save_path=prefix,
                      fused_layers=graph.fused_layers, record_file=record_file)
    return {k: prefix + SUFFIXES[k] for k in model_kinds(save_type)}


class CaffeExporter(Exporter):
    """The Caffe models of ``opts.save_type`` (None: none) and the quant info JSON."""

    label = "Caffe"
    suffixes = SUFFIXES

    def kinds(self) -> list[str]:
        save_type = self.opts.save_type
        return model_kinds(save_type) if save_type is not None else []

    def write(self, inputs: ExportInputs) -> dict[str, str]:
        return write_caffe_models(inputs.graph, inputs.records, self.opts.save_type, inputs.prefix,
                                  inputs.record_file)
