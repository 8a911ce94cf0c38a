"""Caffe's DataTransformer in the TEST phase: the ``transform_param`` of a data layer.

Order, as Caffe's data_transformer.cpp: (SSD fork only: ``resize_param`` WARP resize), centre
crop (``crop_size``, or the SSD fork's ``crop_h``/``crop_w``) at offsets ``(H - crop) / 2``
and ``(W - crop) / 2``, subtract the mean (``mean_file``: per pixel, at the same offsets as the
crop; or ``mean_value``: one, or one per channel), then multiply by ``scale``, in float32:
``(pixel - mean) * scale``. ``mirror`` is random in Caffe and not applied here. Every output
element is written once, straight into the batch array, by the steps of inputs/transform.py.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.datum import COLOR, GRAY, NATIVE, Pixels
from amct_torch.inputs.caffe_data.mean_file import read_mean_file
from amct_torch.inputs.caffe_data.optional_deps import require
from amct_torch.inputs.caffe_data.paths import resolve
from amct_torch.inputs.image_checks import MAX_IMAGE_PIXELS
from amct_torch.inputs.transform import centre_window, resize_hwc, subtract_and_scale
from amct_torch.proto import amct_caffe_pb2 as pb

log = logging.getLogger("amct_torch")

#: the SSD fork's ResizeParameter.Interp_mode -> OpenCV's interpolation flag name
_INTERP = {1: "INTER_LINEAR", 2: "INTER_AREA", 3: "INTER_NEAREST", 4: "INTER_CUBIC",
           5: "INTER_LANCZOS4"}


class DataTransformer:
    """``transform_param`` of the data layer ``layer`` (file names resolved against
    ``base_dir``, the prototxt's folder). ``decode_mode`` is how encoded images decode."""

    def __init__(self, param: pb.TransformationParameter, *, base_dir: Optional[str] = None,
                 layer: Optional[str] = None) -> None:
        self.layer = layer
        self.scale = np.float32(param.scale)
        if not np.isfinite(self.scale):
            raise DataError(f"transform_param scale is {param.scale}", layer=layer)
        if param.force_color and param.force_gray:
            raise DataError("transform_param sets both force_color and force_gray", layer=layer)
        self.decode_mode = COLOR if param.force_color else GRAY if param.force_gray else NATIVE
        self.mean_file: Optional[str] = None
        self.mean: Optional[np.ndarray] = None
        self.mean_values: Optional[np.ndarray] = None
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise DataError("transform_param gives both mean_file and mean_value; Caffe "
                                "takes one", layer=layer)
            self.mean_file = resolve(param.mean_file, base_dir, "mean file", layer)
            self.mean = read_mean_file(self.mean_file)
        elif len(param.mean_value):
            self.mean_values = np.asarray(param.mean_value, np.float32)
        if not param.crop_size and bool(param.crop_h) != bool(param.crop_w):
            raise DataError("transform_param gives one of crop_h and crop_w; give both (or "
                            "crop_size)", layer=layer)
        self.crop = (param.crop_size, param.crop_size) if param.crop_size else (
            (param.crop_h, param.crop_w) if param.crop_h else None)
        self.resize: Optional[tuple[int, int, str]] = None
        if param.HasField("resize_param"):
            self.resize = _resize_spec(param.resize_param, layer)

    def output_shape(self, c: int, h: int, w: int, where: str = "the first record",
                     file: Optional[str] = None) -> tuple[int, int, int]:
        """The C×H×W an image of C×H×W becomes; DataError when the crop, the mean file or the
        mean values do not fit it."""
        if self.resize is not None:
            h, w = self.resize[0], self.resize[1]
        if self.crop is not None and (h < self.crop[0] or w < self.crop[1]):
            raise DataError(f"{where}: the image is {h}x{w}, smaller than the crop "
                            f"{self.crop[0]}x{self.crop[1]}", file=file, layer=self.layer)
        if self.mean is not None and self.mean.shape != (c, h, w):
            raise DataError(f"the mean is {'x'.join(map(str, self.mean.shape))} (CxHxW), the "
                            f"images are {c}x{h}x{w} ({where}){'' if self.resize else ' before the crop'}",
                            file=self.mean_file, layer=self.layer)
        if self.mean_values is not None and len(self.mean_values) not in (1, c):
            raise DataError(f"transform_param gives {len(self.mean_values)} mean_value; the "
                            f"images have {c} channels (give 1 or {c})", layer=self.layer)
        return (c, *self.crop) if self.crop is not None else (c, h, w)

    def apply(self, px: Pixels, out: np.ndarray, where: str, file: Optional[str]) -> None:
        """Write the transformed image ``px`` into ``out`` (float32 C×H×W of the batch)."""
        arr, hwc = px.array, px.hwc
        if self.resize is not None:
            cv2 = require("cv2", "resized images", file)
            arr = resize_hwc(arr if hwc else arr.transpose(1, 2, 0), self.resize[0],
                             self.resize[1], getattr(cv2, self.resize[2]))
            hwc = True
        c, h, w = (arr.shape[2], arr.shape[0], arr.shape[1]) if hwc else arr.shape
        oc, oh, ow = out.shape
        if c != oc or (self.crop is None and (h, w) != (oh, ow)) or h < oh or w < ow:
            raise DataError(f"{where}: the image is {c}x{h}x{w} (CxHxW), the batch takes "
                            f"{oc}x{oh}x{ow}" + ("" if self.crop else "; images of several "
                                                 "sizes need a crop_size"),
                            file=file, layer=self.layer)
        rows, cols = centre_window(h, w, oh, ow)
        view = arr[rows, cols].transpose(2, 0, 1) if hwc else arr[:, rows, cols]
        mean = self.mean_values
        if self.mean is not None:
            if self.mean.shape != (c, h, w):
                raise DataError(f"{where}: the image is {c}x{h}x{w}, the mean is "
                                f"{'x'.join(map(str, self.mean.shape))}", file=self.mean_file,
                                layer=self.layer)
            mean = self.mean[:, rows, cols]
        subtract_and_scale(view, mean, self.scale, out)


def _resize_spec(rp: pb.ResizeParameter, layer: Optional[str]) -> tuple[int, int, str]:
    """(height, width, OpenCV interpolation) of the SSD fork's resize_param (WARP only)."""
    if rp.resize_mode != pb.ResizeParameter.WARP:
        raise DataError(f"transform_param resize_param resize_mode "
                        f"{pb.ResizeParameter.Resize_mode.Name(rp.resize_mode)} is not "
                        "supported (WARP is)", layer=layer)
    if rp.height < 1 or rp.width < 1 or rp.height * rp.width > MAX_IMAGE_PIXELS:
        raise DataError(f"transform_param resize_param resizes to {rp.height}x{rp.width}",
                        layer=layer)
    modes = list(rp.interp_mode)
    if len(modes) > 1:
        log.warning("layer '%s': resize_param lists %d interp_mode, drawn at random in Caffe; "
                    "the first (%s) is used", layer, len(modes),
                    pb.ResizeParameter.Interp_mode.Name(modes[0]))
    return rp.height, rp.width, _INTERP[modes[0]] if modes else "INTER_LINEAR"
