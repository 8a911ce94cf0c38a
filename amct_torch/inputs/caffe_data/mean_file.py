"""Caffe's mean file: a binary ``BlobProto`` (``compute_image_mean`` writes one) of the
per-pixel mean, C×H×W, subtracted before the crop offsets are applied (same offsets)."""
from __future__ import annotations

import os

import numpy as np
from google.protobuf.message import DecodeError

from amct_torch.errors import DataError
from amct_torch.inputs.limits import check_regular_file
from amct_torch.proto import amct_caffe_pb2 as pb

#: largest mean file read (a 3×4096×4096 float mean is 200 MB)
MAX_MEAN_FILE_BYTES = 1 << 30


def read_mean_file(path: str) -> np.ndarray:
    """The mean as a float32 C×H×W array. The blob is 3-D (C,H,W), 4-D with one item
    (1,C,H,W), or given by the legacy num/channels/height/width fields; its values in
    ``data`` or ``double_data``. Anything else is a DataError naming the file."""
    check_regular_file(path, "mean file")
    size = os.path.getsize(path)
    if size > MAX_MEAN_FILE_BYTES:
        raise DataError(f"the mean file has {size} bytes; at most {MAX_MEAN_FILE_BYTES} are "
                        "read", file=path)
    blob = pb.BlobProto()
    try:
        with open(path, "rb") as f:
            blob.ParseFromString(f.read())
    except DecodeError:
        raise DataError("not a binary BlobProto mean file",
                        file=path) from None
    if blob.HasField("shape"):
        dims = [int(d) for d in blob.shape.dim]
    else:
        dims = [blob.num, blob.channels, blob.height, blob.width]
    if len(dims) == 4 and dims[0] == 1:
        dims = dims[1:]
    if len(dims) != 3 or min(dims) < 1:
        raise DataError(f"the mean blob has shape {dims}; a mean file holds one C×H×W image",
                        file=path)
    values = blob.data if len(blob.data) else blob.double_data
    count = dims[0] * dims[1] * dims[2]
    if len(values) != count:
        raise DataError(f"the mean blob's shape {dims} needs {count} values, it holds "
                        f"{len(values)}", file=path)
    mean = np.asarray(values, dtype=np.float32).reshape(dims)
    if not np.isfinite(mean).all():
        raise DataError("the mean holds NaN or infinite values", file=path)
    return mean
