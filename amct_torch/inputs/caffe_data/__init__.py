"""A Caffe net's own data layers read as Caffe reads them in the TEST phase: LMDB and LevelDB
databases of Datum / AnnotatedDatum records, ImageData list files, HDF5Data files, DummyData,
MemoryData's shape; ``transform_param`` applied as Caffe's DataTransformer (docs/data.md)."""
from amct_torch.inputs.caffe_data.datum import datum_pixels, decode_image, parse_datum
from amct_torch.inputs.caffe_data.layers import DATA_LAYER_TYPES, is_data_layer, open_data_layer
from amct_torch.inputs.caffe_data.mean_file import read_mean_file
from amct_torch.inputs.caffe_data.phase_data import PhaseData
from amct_torch.inputs.caffe_data.source import DataSource
from amct_torch.inputs.caffe_data.transformer import DataTransformer

__all__ = ["DATA_LAYER_TYPES", "DataSource", "DataTransformer", "PhaseData", "datum_pixels",
           "decode_image", "is_data_layer", "open_data_layer", "parse_datum", "read_mean_file"]
