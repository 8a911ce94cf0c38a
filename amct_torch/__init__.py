"""amct_torch: post-training quantization of Caffe models with PyTorch (AMCT-compatible)."""
from amct_torch.errors import (AmctError, CalibrationError, ConfigError, DataError, ExportError,
                               ModelError, RecordError)
from amct_torch.caffe.graph import load_caffe

__version__ = "0.1.0"

__all__ = ["AmctError", "CalibrationError", "ConfigError", "DataError", "ExportError",
           "ModelError", "RecordError", "__version__", "load_caffe"]
