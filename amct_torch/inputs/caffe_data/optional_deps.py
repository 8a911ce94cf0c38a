"""The third-party readers a Caffe data layer needs, imported when first used.

Why: LMDB and OpenCV are part of every install, LevelDB (plyvel) and HDF5 (h5py) are
optional extras; a missing one must say in one line which extra installs it, not end in a
ModuleNotFoundError traceback.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from amct_torch.errors import DataError
from amct_torch.inputs.image_checks import bound_opencv_decoding

_PACKAGES = {
    "lmdb": ("lmdb", "amct_torch"),
    "plyvel": ("plyvel", "amct_torch[leveldb]"),
    "h5py": ("h5py", "amct_torch[hdf5]"),
    "cv2": ("opencv-python-headless", "amct_torch"),
}


def require(module: str, what: str, file: Optional[str] = None) -> ModuleType:
    """Import ``module`` (one of lmdb, plyvel, h5py, cv2) or raise a one-line DataError naming
    the pip requirement that provides it; ``what`` says what needs it (e.g. "LevelDB data")."""
    if module == "cv2":  # bound what a forged image header can make OpenCV allocate
        bound_opencv_decoding()
    try:
        return importlib.import_module(module)
    except ImportError:
        dist, extra = _PACKAGES[module]
        raise DataError(f"reading {what} needs the Python package '{dist}', which is not "
                        f"installed: pip install '{extra}'"
                        + ("" if extra == "amct_torch" else f" (or pip install {dist})"),
                        file=file) from None
