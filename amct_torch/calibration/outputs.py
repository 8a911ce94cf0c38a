"""The output models of a calibration, through the exporters (``amct_torch.export``).

Why a thin adapter: ``save_model``/``convert_model`` and the one-call API need the exporters,
which live in another package; this file is the only place that knows their entry points, so
a change there touches one file here.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from amct_torch.errors import ExportError

log = logging.getLogger("amct_torch")


def output_paths(save_path: str, save_type: str) -> list[str]:
    """The files ``save_model`` writes for ``save_type`` (SPEC §1)."""
    out = []
    if save_type in ("Fakequant", "Both"):
        out += [f"{save_path}_fake_quant_model.prototxt", f"{save_path}_fake_quant_weights.caffemodel"]
    if save_type in ("Deploy", "Both"):
        out += [f"{save_path}_deploy_model.prototxt", f"{save_path}_deploy_weights.caffemodel"]
    return out + [f"{save_path}_quant.json"]


def _exporter(name: str) -> Any:
    try:
        import amct_torch.export as export
    except ImportError:
        return None
    return getattr(export, name, None)


def export_models(graph: Any, records: Mapping[str, Any], save_type: str, save_path: str) -> list[str]:
    """Write the fake-quant and/or deploy Caffe models and the quant info JSON of a calibrated
    graph (fused float model + record) with the exporters."""
    save = _exporter("save_quant_models")
    if save is None:
        raise ExportError("the Caffe exporters are not available in this build "
                          "(amct_torch.export.save_quant_models is missing)")
    save(graph.fused, records, save_type=save_type, save_path=save_path,
         fused_layers=graph.fused_layers, record_file=graph.record_file)
    return [p for p in output_paths(save_path, save_type) if os.path.exists(p)]


def convert(model_file: str, weights_file: str, record_file: str, save_path: str) -> list[str]:
    """``convert_model``: the exporters' own implementation (record → models)."""
    conv = _exporter("convert_model")
    if conv is None:
        raise ExportError("convert_model is not available in this build "
                          "(amct_torch.export.convert_model is missing)")
    conv(model_file, weights_file, record_file, save_path)
    return [p for p in output_paths(save_path, "Both") if os.path.exists(p)]


def export_onnx_model(graph: Any, records: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    """``{prefix}_float.onnx`` and ``{prefix}_quant.onnx`` (QDQ) via
    ``amct_torch.export.export_onnx``; returns both paths."""
    fn = _exporter("export_onnx")
    if fn is None:
        raise ExportError("ONNX export is not available in this build "
                          "(amct_torch.export.export_onnx is missing)")
    float_path, quant_path = fn(graph.fused, records, prefix, file=graph.record_file)
    return float_path, quant_path


def exporters_available() -> bool:
    """Whether the Caffe exporters are present (the demo writes models only then)."""
    return _exporter("save_quant_models") is not None
