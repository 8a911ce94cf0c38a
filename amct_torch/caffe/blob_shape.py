"""A Caffe blob's declared shape and the check that its values fill it.

Why a module of its own: both the whole-message reader (``netio``) and the layer-by-layer one
(``stream_reader``) apply exactly these rules, and neither may import the other.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb

LEGACY_DIMS = ("num", "channels", "height", "width")

#: Caffe's kMaxBlobAxes: a blob has at most 32 axes.
MAX_BLOB_AXES = 32


def blob_shape(blob: pb.BlobProto, file: Optional[str] = None, layer: Optional[str] = None,
               index: int = 0) -> list[int]:
    """The declared shape of a blob: legacy num/channels/height/width (4-D) if any is present,
    else ``shape.dim``; at most 32 axes (Caffe's limit), no negative dimension."""
    legacy = any(blob.HasField(f) for f in LEGACY_DIMS)
    dims = blob.shape.dim
    if not legacy and len(dims) > MAX_BLOB_AXES:
        raise ModelError(f"blob {index} has {len(dims)} axes; Caffe allows at most {MAX_BLOB_AXES}",
                         file=file, layer=layer)
    shape = [blob.num, blob.channels, blob.height, blob.width] if legacy else list(dims)
    if any(d < 0 for d in shape):
        raise ModelError(f"blob {index} declares a negative dimension {shape}", file=file, layer=layer)
    return shape


def check_value_count(values: np.ndarray, shape: list[int], file: Optional[str], layer: Optional[str],
                      index: int) -> None:
    """A ModelError naming the file and layer unless ``values`` fills ``shape`` exactly."""
    count = 1
    for d in shape:
        count *= int(d)
    if values.size != count:
        raise ModelError(f"blob {index} has {values.size} values but shape {shape} needs {count}",
                         file=file, layer=layer)
