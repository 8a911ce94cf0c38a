"""amct_torch: post-training quantization of Caffe models with PyTorch (AMCT-compatible).

The public API is what this module exports: AMCT's workflow (``create_quant_config``,
``init``, ``quantize_model``, ``save_model``, ``convert_model``,
``accuracy_based_auto_calibration``), the one-call ``quantize``, the Caffe loader/writer,
BN fusion, the exporters and the per-layer report, and the project's error types.

Names are imported on first use (module ``__getattr__``): ``import amct_torch`` and the
``amct-torch`` command's ``--help`` and argument errors do not pay for torch (~1–2 s), ONNX
or OpenCV; each is imported by the code that needs it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.errors import (
    AmctError,
    ArgumentError,
    CalibrationError,
    ConfigError,
    DataError,
    ExportError,
    ModelError,
    RecordError,
)
from amct_torch.runtime.lazy_names import lazy_names

__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY = {
    "load_caffe": "amct_torch.caffe.graph",
    "save_caffe": "amct_torch.caffe.netio", "write_net": "amct_torch.caffe.netio",
    **{n: "amct_torch.api" for n in ("QuantGraph", "convert_model", "create_quant_config", "init",
                                     "quantize_model", "save_model")},
    **{n: "amct_torch.workflow" for n in ("QuantizeOptions", "QuantizeResult", "quantize")},
    "Preprocess": "amct_torch.inputs.data",
    "AutoCalibrationEvaluatorBase": "amct_torch.quality.auto_calibration",
    "accuracy_based_auto_calibration": "amct_torch.quality.auto_calibration",
    "export_onnx": "amct_torch.export", "fake_quant_graph": "amct_torch.export",
    "fuse_bn": "amct_torch.fusion",
    "read_record": "amct_torch.record", "write_record": "amct_torch.record",
    "LayerStat": "amct_torch.quality.report", "format_table": "amct_torch.quality.report",
    "layer_report": "amct_torch.quality.report",
    "caffe_test": "amct_torch.quality.net_scores",
}

__all__ = ["AmctError", "ArgumentError", "CalibrationError", "ConfigError", "DataError", "ExportError",
           "ModelError", "RecordError", "__version__",
           "load_caffe", "save_caffe", "write_net",
           "create_quant_config", "init", "quantize_model", "save_model", "convert_model",
           "accuracy_based_auto_calibration", "AutoCalibrationEvaluatorBase",
           "quantize", "QuantizeOptions", "Preprocess", "QuantGraph", "QuantizeResult",
           "export_onnx", "fake_quant_graph", "fuse_bn", "read_record", "write_record",
           "LayerStat", "format_table", "layer_report", "caffe_test"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.api import QuantGraph, convert_model, create_quant_config, init, quantize_model, save_model
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.caffe.netio import save_caffe, write_net
    from amct_torch.export import export_onnx, fake_quant_graph
    from amct_torch.fusion import fuse_bn
    from amct_torch.inputs.data import Preprocess
    from amct_torch.quality.auto_calibration import AutoCalibrationEvaluatorBase, accuracy_based_auto_calibration
    from amct_torch.quality.net_scores import caffe_test
    from amct_torch.quality.report import LayerStat, format_table, layer_report
    from amct_torch.record import read_record, write_record
    from amct_torch.workflow import QuantizeOptions, QuantizeResult, quantize
