"""The output models of a calibrated graph, written by the exporters.

Why here: ``save_model``, the one-call job and auto calibration all write the same set of
files from a calibrated graph (the fused float model + its record, held in memory); this file
calls the exporters with the graph's fusion map (``amct_torch.files.output_names`` names the files).
``record_file`` is only what the exporters' errors name: the file the record was read from,
or None for a record computed in memory (the caller then names the files its values came
from).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

from amct_torch.export import convert_model, export_onnx, save_quant_models
from amct_torch.files.output_names import model_paths


def export_models(graph: Any, records: Mapping[str, Any], save_type: str, save_path: str,
                  record_file: Optional[str] = None) -> list[str]:
    """Write the fake-quant and/or deploy Caffe models and the quant info JSON of a calibrated
    graph from ``records``; returns the paths written."""
    save_quant_models(graph.fused, records, save_type=save_type, save_path=save_path,
                      fused_layers=graph.fused_layers, record_file=record_file)
    return [p for p in model_paths(save_path, save_type) if os.path.exists(p)]


def convert(model_file: str, weights_file: str, record_file: str, save_path: str) -> list[str]:
    """``convert_model`` (record file → models); returns the paths written."""
    convert_model(model_file, weights_file, record_file, save_path)
    return [p for p in model_paths(save_path, "Both") if os.path.exists(p)]


def export_onnx_model(graph: Any, records: Mapping[str, Any], prefix: str,
                      activations: str = "int8", quantize_eltwise: bool = False,
                      calibration_data: Any = None, outputs: Any = None,
                      record_file: Optional[str] = None, float_model: Any = None,
                      target: str = "onnxruntime", float_staged: Optional[tuple[str, str]] = None) -> tuple[str, str]:
    """``{prefix}_float.onnx`` and ``{prefix}_quant.onnx`` (QDQ; activations int8 with zero
    point offset_d, or uint8 with offset_d + 128, the form ONNX Runtime's x86 kernels favour).
    ``quantize_eltwise``: the opt-in speed mode (not AMCT-exact, docs/export.md), whose extra
    factors come from ``calibration_data``. ``float_model``: when ``graph.fused`` was changed by
    an improvement, the float model to write as ``_float.onnx`` instead (always the user's
    float model). ``float_staged``: the float model already written (``export_onnx``)."""
    paths = export_onnx(graph.fused, records, prefix, activations=activations,
                        quantize_eltwise=quantize_eltwise,
                        calibration_data=calibration_data if quantize_eltwise else None,
                        file=record_file, outputs=outputs, target=target,
                        model_file=getattr(graph, "model_file", None), float_graph=float_model,
                        float_staged=float_staged)
    return paths
