"""A net's data layer opened as a DataSource, by layer type.

Relative file names (``source``, ``mean_file``, HDF5 files) are looked up as Caffe does,
relative to the working directory, and then relative to ``base_dir`` (the prototxt's folder).
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.datum_source import DatumSource
from amct_torch.inputs.caffe_data.hdf5_source import Hdf5Source
from amct_torch.inputs.caffe_data.image_list import ImageListSource
from amct_torch.inputs.caffe_data.paths import resolve
from amct_torch.inputs.caffe_data.shape_sources import DummySource, MemorySource
from amct_torch.inputs.caffe_data.source import DataSource
from amct_torch.inputs.caffe_data.transformer import DataTransformer
from amct_torch.proto import amct_caffe_pb2 as pb

#: the data layer types read here
DATA_LAYER_TYPES = ("Data", "ImageData", "HDF5Data", "AnnotatedData", "DummyData", "MemoryData")
#: recognised as data layers only to be refused with a clear message
REFUSED_DATA_LAYER_TYPES = ("WindowData",)

log = logging.getLogger("amct_torch")

#: layer type -> (parameter block, fields) that Caffe applies at random: read in order here
_RANDOM_FIELDS = {"Data": ("data_param", ("rand_skip",)), "AnnotatedData": ("data_param", ("rand_skip",)),
                  "ImageData": ("image_data_param", ("shuffle", "rand_skip")),
                  "HDF5Data": ("hdf5_data_param", ("shuffle",))}


def is_data_layer(type_name: str) -> bool:
    """Whether a layer of this type is a data layer (a source of batches, not a graph
    module). Python layers are not counted: they may be anything."""
    return type_name in DATA_LAYER_TYPES or type_name in REFUSED_DATA_LAYER_TYPES


def open_data_layer(layer: pb.LayerParameter, *, base_dir: str,
                    threads: Optional[int] = None, warn: bool = True) -> DataSource:
    """The batches ``layer`` gives in Caffe's TEST phase (the phase ``caffe test`` runs, the
    only reproducible one: TRAIN draws random crops and mirrors). ``threads``: decoding
    threads (default: the cores, at most 16). ``warn``: warn of the settings Caffe applies at
    random (False where the layer is opened only for its shapes, so a run warns once).
    DataError naming the file and the layer for anything wrong with the data."""
    kind, name = layer.type, layer.name
    if warn:
        _warn_random(layer)
    if kind in ("Data", "AnnotatedData"):
        path = resolve(layer.data_param.source, base_dir, "data_param source", name)
        transformer = DataTransformer(transform_param(layer, layer.data_param),
                                      base_dir=base_dir, layer=name)
        return DatumSource(layer, path, transformer, annotated=kind == "AnnotatedData",
                           threads=threads)
    if kind == "ImageData":
        path = resolve(layer.image_data_param.source, base_dir, "image_data_param source", name)
        transformer = DataTransformer(transform_param(layer, layer.image_data_param),
                                      base_dir=base_dir, layer=name)
        return ImageListSource(layer, path, transformer, base_dir=base_dir, threads=threads)
    if kind == "HDF5Data":
        if layer.HasField("transform_param"):  # Caffe's HDF5DataLayer refuses it too
            raise DataError("an HDF5Data layer does not transform its data: remove transform_param "
                            "(scale, mean, crop the arrays when writing the .h5 files)", layer=name)
        path = resolve(layer.hdf5_data_param.source, base_dir, "hdf5_data_param source", name)
        return Hdf5Source(layer, path, base_dir, threads=threads)
    if kind == "DummyData":
        return DummySource(layer)
    if kind == "MemoryData":
        return MemorySource(layer)
    raise DataError(f"data layer type '{kind}' is not supported (supported: "
                    f"{', '.join(DATA_LAYER_TYPES)})", layer=name)


def _warn_random(layer: pb.LayerParameter) -> None:
    """Warn of the layer's settings that Caffe applies at random (a shuffled list, a random
    skip, the SSD fork's random crops): the records are read in order, uncropped."""
    block, fields = _RANDOM_FIELDS.get(layer.type, ("", ()))
    param = getattr(layer, block) if block else None
    found = [f"{block} {f}" for f in fields if getattr(param, f)]
    old_block = {"Data": "data_param", "AnnotatedData": "data_param", "ImageData": "image_data_param"}
    if layer.type in old_block and transform_param(layer, getattr(layer, old_block[layer.type])).mirror:
        found.append("transform_param mirror")
    if layer.type == "AnnotatedData" and any(
            (s.sampler.min_scale, s.sampler.max_scale) != (1, 1)
            for s in layer.annotated_data_param.batch_sampler):
        found.append("annotated_data_param batch_sampler (a random crop)")
    if found:
        log.warning("layer '%s': %s random in Caffe; the TEST-phase data here are read in order, "
                    "unchanged", layer.name, ", ".join(found) + (" are" if len(found) > 1 else " is"))


def transform_param(layer: pb.LayerParameter, old: Any) -> pb.TransformationParameter:
    """The layer's transform_param, with the transform fields old nets put in data_param /
    image_data_param (scale, mean_file, crop_size, mirror) moved into it where it does not
    give them itself, as Caffe's net upgrade does; an old ``data_param`` ``force_encoded_color``
    (encoded images decoded in colour) is ``force_color``."""
    param = pb.TransformationParameter()
    param.CopyFrom(layer.transform_param)
    for field in ("scale", "mean_file", "crop_size", "mirror"):
        if old.HasField(field) and not param.HasField(field):
            setattr(param, field, getattr(old, field))
    if getattr(old, "force_encoded_color", False) and not param.HasField("force_color"):
        param.force_color = True
    return param
