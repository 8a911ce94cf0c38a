"""amct_torch: post-training quantization of Caffe models with PyTorch (AMCT-compatible).

The public API is what this module exports: AMCT's workflow (``create_quant_config``,
``init``, ``quantize_model``, ``save_model``, ``convert_model``,
``accuracy_based_auto_calibration``), the one-call ``quantize``, the Caffe loader/writer,
BN fusion, the exporters and the per-layer report, and the project's error types.
"""
from amct_torch.errors import (AmctError, CalibrationError, ConfigError, DataError, ExportError,
                               ModelError, RecordError)
from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import save_caffe, write_net
from amct_torch.api import (Preprocess, QuantGraph, QuantizeResult, convert_model,
                            create_quant_config, init, quantize, quantize_model, save_model)
from amct_torch.auto_calibration import (AutoCalibrationEvaluatorBase,
                                         accuracy_based_auto_calibration)
from amct_torch.export import export_onnx, fake_quant_graph
from amct_torch.fusion import fuse_bn
from amct_torch.record import read_record, write_record
from amct_torch.report import LayerStat, format_table, layer_report

__version__ = "0.1.0"

__all__ = ["AmctError", "CalibrationError", "ConfigError", "DataError", "ExportError",
           "ModelError", "RecordError", "__version__",
           "load_caffe", "save_caffe", "write_net",
           "create_quant_config", "init", "quantize_model", "save_model", "convert_model",
           "accuracy_based_auto_calibration", "AutoCalibrationEvaluatorBase",
           "quantize", "Preprocess", "QuantGraph", "QuantizeResult",
           "export_onnx", "fake_quant_graph", "fuse_bn", "read_record", "write_record",
           "LayerStat", "format_table", "layer_report"]
