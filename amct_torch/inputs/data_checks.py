"""Checks of the user's data against the net and the preprocessing, made before any sample is
read: the preprocessing options where they cannot apply, the size images will have after
preprocessing (for the activation-memory check), and the images read only after calibration.

Why its own module: the one-call job and ``evaluate`` take the same data the same way, and
check it the same way before their first forward.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from amct_torch.inputs.data import IMAGE_EXTS, Preprocess, check_resize

log = logging.getLogger("amct_torch")


def _image_data(data: Any, inputs: Any) -> Optional[str]:
    """The path of ``data`` when it is a file or folder of images for a net with inputs, else None."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return None
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    return path if any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names) else None


def _net_hw(shape: Any) -> Optional[tuple[int, int]]:
    """(H, W) of an NCHW input shape, or None."""
    return (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None


def check_data_settings(data: Any, inputs: Any, pre: Optional[Preprocess], model_file: Optional[str]) -> None:
    """Warn when --mean/--scale/--resize cannot apply (arrays are used as they are) and refuse
    a resize target beyond the image budget before any image is read (``DataError`` naming
    ``model_file``, the net that declares the size)."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return
    pre = pre or Preprocess()
    if _image_data(data, inputs) is not None:
        check_resize(_net_hw(inputs[0][1]), pre, model_file)
    elif pre.mean is not None or pre.scale != 1.0 or pre.resize is not None or pre.crop is not None:
        log.warning("--mean/--scale/--resize/--crop apply to images only: the arrays of %s are "
                    "used as they are", os.fspath(data))


def preprocessed_sample_shape(data: Any, inputs: Any, pre: Optional[Preprocess]) -> Optional[tuple]:
    """The shape of one image sample after ``pre`` (channels, height, width), known before any
    image is read: the crop, else the resize (one number: the shorter side, so at least that
    square), else the net's declared size. None for arrays (used as they are) or no images."""
    if _image_data(data, inputs) is None or _net_hw(inputs[0][1]) is None:
        return None
    shape = inputs[0][1]
    pre = pre or Preprocess()
    target = pre.crop if pre.crop is not None else pre.resize
    if target is None:
        return tuple(int(d) for d in shape[1:])
    sizes = [int(target)] if isinstance(target, int) else [int(v) for v in target]
    h, w = sizes[0], sizes[-1]
    return (int(shape[1]), h, w)


def check_held_out_images(data: Any, inputs: Any, pre: Optional[Preprocess], start: int, count: int) -> None:
    """Decode, before calibration, the images of a data folder that the per-layer report will
    read after it (samples ``start`` .. ``start + count``): one that cannot be read is a
    ``DataError`` naming it now, not after the calibration and the writes."""
    from amct_torch.inputs.data import data_folder_files, load_image
    if not isinstance(data, (str, os.PathLike)) or not inputs or not os.path.isdir(data):
        return
    files = data_folder_files(os.fspath(data))
    if not files or os.path.splitext(files[0])[1].lower() not in IMAGE_EXTS:
        return
    shape = inputs[0][1]
    hw = _net_hw(shape)
    channels = int(shape[1]) if hw is not None else 3
    for path in files[start:start + count]:
        load_image(path, pre or Preprocess(), channels, hw)
