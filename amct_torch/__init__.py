"""amct_torch: post-training quantization of Caffe models with PyTorch (AMCT-compatible)."""
from amct_torch.errors import (AmctError, CalibrationError, ConfigError, DataError, ExportError,
                               ModelError, RecordError)
from amct_torch.caffe.graph import load_caffe
from amct_torch.api import (Preprocess, QuantGraph, QuantizeResult, convert_model,
                            create_quant_config, init, quantize, quantize_model, save_model)
from amct_torch.report import LayerStat, layer_report

__version__ = "0.1.0"

__all__ = ["AmctError", "CalibrationError", "ConfigError", "DataError", "ExportError",
           "ModelError", "RecordError", "__version__", "load_caffe",
           "Preprocess", "QuantGraph", "QuantizeResult", "convert_model", "create_quant_config",
           "init", "quantize", "quantize_model", "save_model", "LayerStat", "layer_report"]
