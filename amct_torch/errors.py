"""The project's exception types.

Errors are part of the interface: every problem with a user's model, config, record or data
raises one of these, naming the file and (where there is one) the layer, so that the CLI can
print one line and exit with code 2 instead of a traceback.
"""
from __future__ import annotations

from typing import Optional

#: longest message body kept whole; longer ones (a parser echoing an 80 KB line) are cut to a
#: head and a tail around a note of how much was left out
MAX_MESSAGE = 400


def excerpt(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line, cut in the middle to at most about ``limit`` characters."""
    text = " ".join(str(text).split()) if "\n" in str(text) else str(text)
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} [... {len(text) - 2 * keep} characters cut ...] {text[-keep:]}"


class AmctError(Exception):
    """Base class of every error caused by the user's input.

    ``file`` and ``layer`` are kept as attributes so callers can inspect them; ``str()``
    gives the one-line message the CLI prints.
    """

    def __init__(self, message: str, *, file: Optional[str] = None, layer: Optional[str] = None,
                 line: Optional[int] = None) -> None:
        self.message = excerpt(message)
        self.file = None if file is None else str(file)
        self.layer = layer
        self.line = line
        super().__init__(self._format())

    def with_file(self, file: Optional[str]) -> AmctError:
        """The same error naming ``file`` instead (e.g. the user's file rather than a private
        working copy); returns ``self`` so that it can be re-raised."""
        self.file = None if file is None else str(file)
        self.args = (self._format(),)
        return self

    def _format(self) -> str:
        where = []
        if self.file is not None:
            where.append(self.file if self.line is None else f"{self.file}:{self.line}")
        if self.layer is not None:
            where.append(f"layer '{self.layer}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class ModelError(AmctError):
    """A Caffe model (prototxt or caffemodel) is malformed or unsupported."""


class ConfigError(AmctError):
    """A quant.cfg or JSON quant config is malformed or invalid for the model."""


class RecordError(AmctError):
    """A scale/offset record file is malformed or invalid for the model."""


class DataError(AmctError):
    """Calibration or evaluation data is missing, unreadable or of the wrong shape."""


class CalibrationError(AmctError):
    """Calibration could not produce factors (e.g. NaN/Inf activations in a layer)."""


class ExportError(AmctError):
    """An output model cannot be written (e.g. an int32 bias overflow)."""


class ArgumentError(AmctError, ValueError):
    """A Python API call got an argument of the wrong type or value (the message names the
    function and the argument). Also a ``ValueError``, which callers of the API caught before."""


class OutputError(AmctError, OSError):
    """An output could not be written (no space left, permission denied, a read-only file
    system): the message names the user's output path. Also an ``OSError`` (with the
    system's ``errno``), which callers caught before."""

    def __str__(self) -> str:  # the one line, not OSError's "[Errno N] ..."
        return self._format()
