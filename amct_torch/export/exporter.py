"""The exporter interface: what one output format of the calibrate job declares and does.

Why: the job writes every format the same way -- the names it owns, a check before
calibration, work started before calibration, the write into the output transaction, the
clean-up -- so it loops over exporters and knows no format by name. A format is one subclass
(``formats.py`` lists them; docs/extending.md, "Adding an output format"). Nothing heavy is
imported here: the declarations are read by ``--help``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

__all__ = ["ExportInputs", "Exporter"]


@dataclass
class ExportInputs:
    """What a calibrated job hands every exporter: the graph (``steps.QuantGraph``: ``fused``,
    ``fused_layers``, ``model_file``), its validated record, the staged output prefix to
    write under, the float model when ``graph.fused`` was changed by an improvement (else
    None), the calibration batches kept in memory, and the record file the factors came from
    (None: computed in memory)."""

    graph: Any
    records: Mapping[str, Any]
    prefix: str
    float_model: Any = None
    batches: Sequence[Any] = ()
    record_file: Optional[str] = None


class Exporter:
    """One output format of the calibrate job, made for one run's options (``opts``, a
    ``QuantizeOptions``). A subclass declares ``label`` (in the progress line "writing the
    Caffe and ONNX models") and ``suffixes`` (kind -> file suffix of every file it may write:
    the transaction owns them and a rerun removes the ones it does not write), and implements
    ``kinds`` and ``write``; the other steps default to nothing. ``check_options`` is asked for
    every registered format, wanted or not, so a format also refuses its settings given without it."""

    label: ClassVar[str] = ""
    suffixes: ClassVar[Mapping[str, str]] = {}

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    @property
    def reads_batches(self) -> bool:
        """Whether this run's ``write`` reads ``ExportInputs.batches`` (the job then keeps every
        calibration batch in memory)."""
        return False

    @classmethod
    def check_options(cls, opts: Any) -> None:
        """Refuse, before any file is read, settings of this format that cannot be honoured or
        would be dropped (an ``AmctError``); ``opts``: the ``QuantizeOptions`` being validated.
        Reads only the options: nothing heavy may be imported unless the format is wanted."""

    def kinds(self) -> list[str]:
        """The kinds (keys of ``suffixes``) the options ask for; none: the format is not written."""
        raise NotImplementedError

    def check(self, graph: Any) -> None:
        """Refuse, before calibration, what would stop ``write`` afterwards (an ``AmctError``
        naming the user's file). ``graph``: the loaded ``QuantGraph``, not yet fused."""

    def prepare(self, fused: Any, prefix: str) -> None:
        """After BN fusion and ARQ, before the observers attach (only in the process that writes):
        build what needs no calibration, to be written under the staged ``prefix``."""

    def start(self) -> None:
        """Right before the first calibration batch: start writing what ``prepare`` built."""

    def write(self, inputs: ExportInputs) -> dict[str, str]:
        """Write every file of ``kinds()`` under ``inputs.prefix``; returns kind -> path written.
        May run on a helper thread beside the other exporters."""
        raise NotImplementedError

    def discard(self) -> None:
        """Drop what ``prepare``/``start`` made and ``write`` did not hand on (the job calls it
        on every path, success or failure)."""

    def path(self, prefix: str, kind: str) -> str:
        """The file of ``kind`` under ``prefix``."""
        return prefix + self.suffixes[kind]
