"""The image transform steps both image front ends share: the image-folder ``Preprocess``
(inputs/data.py) and the Caffe data layers' TEST-phase ``DataTransformer``
(inputs/caffe_data/transformer.py). Each front end keeps its own order and checks.

Why one module: both promise Caffe's arithmetic (a bilinear OpenCV resize, a centre crop at
``((H - h) // 2, (W - w) // 2)``, then ``(pixel - mean) * scale`` in float32), so the same
image with the same settings must give the same bits through either."""
from __future__ import annotations

from typing import Optional

import numpy as np


def resize_hwc(img: np.ndarray, h: int, w: int, interpolation: Optional[int] = None) -> np.ndarray:
    """The H×W×C (or H×W) image ``img`` resized by OpenCV to ``h``×``w`` (``interpolation`` a
    ``cv2.INTER_*`` flag, default bilinear); an H×W×1 image keeps its channel axis."""
    import cv2
    flag = cv2.INTER_LINEAR if interpolation is None else interpolation
    out = cv2.resize(np.ascontiguousarray(img), (w, h), interpolation=flag)
    return out[:, :, None] if out.ndim == 2 and img.ndim == 3 else out


def centre_window(h: int, w: int, out_h: int, out_w: int) -> tuple[slice, slice]:
    """The rows and columns of the centre ``out_h``×``out_w`` window of an ``h``×``w`` image,
    at Caffe's TEST-phase offsets ``(h - out_h) // 2`` and ``(w - out_w) // 2``."""
    y, x = (h - out_h) // 2, (w - out_w) // 2
    return slice(y, y + out_h), slice(x, x + out_w)


def subtract_and_scale(chw: np.ndarray, mean: Optional[np.ndarray], scale: np.float32,
                       out: np.ndarray) -> np.ndarray:
    """Write ``(chw - mean) * scale`` into ``out`` (float32 C×H×W) and return it: ``mean`` a
    C×H×W per-pixel mean (cut to the same window), one value per channel, one value for all,
    or None; each element is computed once, in float32, mean first, as Caffe does."""
    if mean is None:
        out[...] = chw
    else:
        np.subtract(chw, mean[:, None, None] if mean.ndim == 1 else mean, out=out)
    if scale != 1:
        np.multiply(out, scale, out=out)
    return out
