"""The example model and data shipped inside the package.

Why: the main job (and the README's first command) must run on a fresh install with no
download. The package carries a small LeNet-style Caffe model trained on scikit-learn's
digits (made by ``scripts/train_example.py``, see docs/example_model.md) together with a
calibration split and a held-out test split, already preprocessed as the model expects:
pixel/16, each 8x8 digit upsampled to 16x16 by 2x2 pixel repetition, float32 NCHW.
"""
from __future__ import annotations

import os

import numpy as np

from amct_torch.errors import DataError

__all__ = ["EXAMPLE_INPUT_SHAPE", "EXAMPLE_DIR", "example_model", "example_data"]

#: Shape of one input batch as declared in the example prototxt (N, C, H, W).
EXAMPLE_INPUT_SHAPE: tuple[int, int, int, int] = (1, 1, 16, 16)

#: Folder of the bundled files (inside the installed package).
EXAMPLE_DIR: str = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "example")

_SPLITS = ("calib", "test")


def _bundled(name: str) -> str:
    """Path of a bundled file; a DataError naming it if the install lacks it."""
    path = os.path.join(EXAMPLE_DIR, name)
    if not os.path.isfile(path):
        raise DataError("bundled example file is missing (broken install?)", file=path)
    return path


def example_model() -> tuple[str, str]:
    """Paths of the bundled example model: ``(prototxt, caffemodel)``."""
    return _bundled("lenet_digits.prototxt"), _bundled("lenet_digits.caffemodel")


def example_data(split: str) -> tuple[np.ndarray, np.ndarray]:
    """One bundled data split: ``split`` is ``"calib"`` (180 samples, for calibration) or
    ``"test"`` (539 held-out samples, for accuracy). Returns ``(inputs, labels)``: float32
    ``(N, 1, 16, 16)`` already preprocessed, and int64 ``(N,)`` digit labels 0..9."""
    if split not in _SPLITS:
        raise DataError(f"unknown example split {split!r}; choose one of {', '.join(_SPLITS)}")
    path = _bundled(f"digits_{split}.npz")
    with np.load(path) as data:
        inputs = np.ascontiguousarray(data["inputs"], dtype=np.float32)
        labels = np.asarray(data["labels"], dtype=np.int64)
    return inputs, labels
