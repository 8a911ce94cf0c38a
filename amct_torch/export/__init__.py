"""The output models: fake-quant and deploy Caffe, quant info JSON, ONNX QDQ, convert_model,
and the exporter interface the one-call job loops over (``exporter.py``, ``formats.py``).
See docs/export.md.

Names are imported on first use: the exporters' declarations (their file names, the ONNX
targets) are read by ``--help`` and the option checks, which must not import torch or onnx."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

_CAFFE, _CONVERT, _INFO = "amct_torch.export.caffe", "amct_torch.export.convert", "amct_torch.export.quant_info"
_FORMATS = "amct_torch.export.formats"
#: public name -> the module that defines it
_LAZY = {
    "deploy_net": f"{_CAFFE}.deploy", "pack_deq_scale": f"{_CAFFE}.deploy", "save_deploy": f"{_CAFFE}.deploy",
    "unpack_deq_scale": f"{_CAFFE}.deploy",
    "fake_quant_graph": f"{_CAFFE}.fakequant", "fake_quant_net": f"{_CAFFE}.fakequant",
    "save_fake_quant": f"{_CAFFE}.fakequant", "write_caffe_models": f"{_CAFFE}.exporter",
    "convert_model": _CONVERT, "refuse_quantized_model": _CONVERT, "save_quant_models": _CONVERT,
    "write_quant_info": _INFO,
    "export_onnx": "amct_torch.export.onnx.qdq",
    "Exporter": "amct_torch.export.exporter", "ExportInputs": "amct_torch.export.exporter",
    "SAVE_TYPES": _CAFFE, "model_paths": _CAFFE, "ONNX_ACTIVATIONS": "amct_torch.export.onnx",
    "ONNX_TARGETS": "amct_torch.export.onnx.runtime_targets",
    "ort_float_layers": "amct_torch.export.onnx.ort_float", "preflight_onnx": "amct_torch.export.onnx.preflight",
    **{n: _FORMATS for n in ("OutputPlan", "check_exporter_options", "exporters_for", "plan_outputs",
                             "planned_outputs", "prefix_outputs", "prefix_suffixes", "register_exporter")},
}

__all__ = ["ONNX_ACTIVATIONS", "ONNX_TARGETS", "SAVE_TYPES", "ExportInputs", "Exporter", "OutputPlan",
           "check_exporter_options", "convert_model", "deploy_net", "export_onnx", "exporters_for",
           "fake_quant_graph", "fake_quant_net", "model_paths", "ort_float_layers", "pack_deq_scale", "plan_outputs",
           "planned_outputs", "preflight_onnx", "prefix_outputs", "prefix_suffixes", "refuse_quantized_model",
           "register_exporter", "save_deploy", "save_fake_quant", "save_quant_models", "unpack_deq_scale",
           "write_caffe_models", "write_quant_info"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.export.caffe import SAVE_TYPES, model_paths
    from amct_torch.export.caffe.deploy import deploy_net, pack_deq_scale, save_deploy, unpack_deq_scale
    from amct_torch.export.caffe.exporter import write_caffe_models
    from amct_torch.export.caffe.fakequant import fake_quant_graph, fake_quant_net, save_fake_quant
    from amct_torch.export.convert import convert_model, refuse_quantized_model, save_quant_models
    from amct_torch.export.exporter import Exporter, ExportInputs
    from amct_torch.export.formats import (
        OutputPlan,
        check_exporter_options,
        exporters_for,
        plan_outputs,
        planned_outputs,
        prefix_outputs,
        prefix_suffixes,
        register_exporter,
    )
    from amct_torch.export.onnx import ONNX_ACTIVATIONS
    from amct_torch.export.onnx.ort_float import ort_float_layers
    from amct_torch.export.onnx.preflight import preflight_onnx
    from amct_torch.export.onnx.qdq import export_onnx
    from amct_torch.export.onnx.runtime_targets import ONNX_TARGETS
    from amct_torch.export.quant_info import write_quant_info
