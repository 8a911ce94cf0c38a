"""Where a data layer's file names (source, mean_file, list entries) point.

Caffe opens them as given, so a relative name is relative to the working directory of the
`caffe` command. Users also keep a net's data next to its prototxt, so a relative name that
does not exist from the working directory is tried relative to the prototxt's folder too.
"""
from __future__ import annotations

import os
from typing import Optional

from amct_torch.errors import DataError


def data_base_dir(model_file: Optional[str]) -> str:
    """Where a data layer's relative ``source`` and ``mean_file`` are looked up when the working
    folder (``caffe test``'s) does not have them: the prototxt's folder."""
    return os.path.dirname(os.path.abspath(model_file)) if model_file else os.getcwd()


def resolve(name: str, base_dir: Optional[str], what: str, layer: Optional[str] = None,
            file: Optional[str] = None) -> str:
    """The path ``name`` refers to: as given (relative to the working directory), else relative
    to ``base_dir`` (the prototxt's folder); DataError naming both places when neither exists."""
    if not name:
        raise DataError(f"the {what} is not given", file=file, layer=layer)
    if os.path.isabs(name) or os.path.exists(name) or not base_dir:
        if not os.path.exists(name):
            raise DataError(f"the {what} '{name}' does not exist", file=file or name, layer=layer)
        return name
    beside = os.path.join(base_dir, name)
    if os.path.exists(beside):
        return beside
    raise DataError(f"the {what} '{name}' does not exist (looked in the working directory "
                    f"{os.getcwd()} and beside the prototxt in {base_dir})",
                    file=file or name, layer=layer)
