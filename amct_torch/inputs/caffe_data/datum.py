"""Caffe's ``Datum`` record decoded as Caffe's data layers decode it.

A Datum holds raw uint8 pixels C×H×W (BGR as ``convert_imageset`` stores them), or
``float_data`` C×H×W, or (``encoded``) the bytes of an image file, decoded with OpenCV:
colour with ``force_color``, grey with ``force_gray``, else as stored (``IMREAD_UNCHANGED``,
Caffe's ``DecodeDatumToCVMatNative``). Sizes are checked against the bytes actually present,
so a forged channels/height/width never drives an allocation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from google.protobuf.message import DecodeError

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.optional_deps import require
from amct_torch.inputs.image_checks import MAX_IMAGE_PIXELS, check_png_chunks, image_size
from amct_torch.proto import amct_caffe_pb2 as pb

#: how an encoded image is decoded (Caffe's force_color / force_gray / native)
COLOR, GRAY, NATIVE = "color", "gray", "native"


@dataclass
class Pixels:
    """One decoded image: ``array`` is H×W×C uint8 (``hwc``, from OpenCV) or C×H×W uint8 or
    float32 (a raw Datum)."""

    array: np.ndarray
    hwc: bool

    @property
    def chw(self) -> tuple[int, int, int]:
        a = self.array
        return (a.shape[2], a.shape[0], a.shape[1]) if self.hwc else a.shape


def parse_record(message: Any, value: bytes, where: str, file: Optional[str]) -> Any:
    """``message`` (a Datum or AnnotatedDatum) parsed from ``value``, the database record
    called ``where``."""
    try:
        message.ParseFromString(value)
    except DecodeError:
        raise DataError(f"{where}: not a serialized {type(message).__name__}",
                        file=file) from None
    return message


def parse_datum(value: bytes, where: str, file: Optional[str]) -> pb.Datum:
    """The Datum serialized in ``value`` (a database record called ``where``)."""
    return parse_record(pb.Datum(), value, where, file)


def decode_image(data: bytes, mode: str, where: str, file: Optional[str]) -> Pixels:
    """An encoded image file's bytes decoded by OpenCV (BGR), ``mode`` one of COLOR, GRAY,
    NATIVE; DataError naming ``where`` when it is not an 8-bit image OpenCV can decode."""
    cv2 = require("cv2", "encoded images", file)
    size = image_size(data)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise DataError(f"{where}: the encoded image declares {size[1]}x{size[0]} pixels; at "
                        f"most {MAX_IMAGE_PIXELS} are decoded", file=file)
    try:
        check_png_chunks(data, name=file)
    except DataError as err:
        raise DataError(f"{where}: {err.message}", file=file) from None
    flag = {COLOR: cv2.IMREAD_COLOR, GRAY: cv2.IMREAD_GRAYSCALE,
            NATIVE: cv2.IMREAD_UNCHANGED}[mode]
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    except cv2.error as err:
        img = None
        why = str(err).strip().splitlines()[-1] if str(err).strip() else "OpenCV error"
    else:
        why = "not an image OpenCV can decode, or corrupt"
    if img is None:
        raise DataError(f"{where}: cannot decode the encoded image ({why})", file=file)
    if img.dtype != np.uint8:
        raise DataError(f"{where}: the encoded image has {img.dtype} samples; Caffe's data "
                        "layers take 8-bit images", file=file)
    if img.ndim == 2:
        img = img[:, :, None]
    return Pixels(img, hwc=True)


def datum_pixels(datum: pb.Datum, mode: str, where: str, file: Optional[str]) -> Pixels:
    """The image a Datum holds (see the module docstring)."""
    if datum.encoded:
        return decode_image(datum.data, mode, where, file)
    c, h, w = datum.channels, datum.height, datum.width
    if c < 1 or h < 1 or w < 1:
        raise DataError(f"{where}: the Datum's channels x height x width is {c}x{h}x{w}",
                        file=file)
    count = c * h * w
    data = datum.data
    if len(data):
        if len(data) != count:
            raise DataError(f"{where}: the Datum holds {len(data)} bytes of pixels, its "
                            f"channels x height x width is {c}x{h}x{w} = {count}", file=file)
        return Pixels(np.frombuffer(data, np.uint8).reshape(c, h, w), hwc=False)
    if len(datum.float_data):
        if len(datum.float_data) != count:
            raise DataError(f"{where}: the Datum holds {len(datum.float_data)} float_data "
                            f"values, its channels x height x width is {c}x{h}x{w} = {count}",
                            file=file)
        return Pixels(np.asarray(datum.float_data, np.float32).reshape(c, h, w), hwc=False)
    raise DataError(f"{where}: the Datum holds neither data nor float_data", file=file)
