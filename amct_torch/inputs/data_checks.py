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


def check_data_settings(data: Any, inputs: Any, pre: Optional[Preprocess], model_file: str) -> None:
    """Warn when --mean/--scale/--resize cannot apply (arrays are used as they are) and refuse
    a resize target beyond the image budget before any image is read."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    images = any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names)
    pre = pre or Preprocess()
    if images:
        shape = inputs[0][1]
        hw = (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None
        check_resize(hw, pre, model_file)
    elif pre.mean is not None or pre.scale != 1.0 or pre.resize is not None or pre.crop is not None:
        log.warning("--mean/--scale/--resize/--crop apply to images only: the arrays of %s are "
                    "used as they are", path)


def preprocessed_sample_shape(data: Any, inputs: Any, pre: Optional[Preprocess]) -> Optional[tuple]:
    """The shape of one image sample after ``pre`` (channels, height, width), known before any
    image is read: the crop, else the resize (one number: the shorter side, so at least that
    square), else the net's declared size. None for arrays (used as they are) or no images."""
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return None
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    shape = inputs[0][1]
    if not any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names) or not shape or len(shape) != 4:
        return None
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
    channels = int(shape[1]) if shape and len(shape) == 4 else 3
    hw = (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None
    for path in files[start:start + count]:
        load_image(path, pre or Preprocess(), channels, hw)
