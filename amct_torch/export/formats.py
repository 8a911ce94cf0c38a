"""The output formats of the calibrate job: the registered exporters, in writing order, and
every file name a run under one output prefix may write.

Why one list: the job plans, checks, writes and cleans up by looping over it, and the names
it gathers are what the output transaction owns (a rerun removes the ones it does not write)
and what ``--help`` lists. Torch-free: the exporter classes import nothing heavy until used."""
from __future__ import annotations

from typing import Any

from amct_torch.export.caffe.exporter import CaffeExporter
from amct_torch.export.exporter import Exporter
from amct_torch.export.onnx.exporter import OnnxExporter
from amct_torch.files.output_names import SUFFIXES as JOB_SUFFIXES

__all__ = ["EXPORTERS", "exporters_for", "prefix_outputs", "prefix_suffixes", "register_exporter"]

#: every output format, in the order the job writes them (the first ones on helper threads)
EXPORTERS: list[type[Exporter]] = [CaffeExporter, OnnxExporter]


def register_exporter(cls: type[Exporter]) -> type[Exporter]:
    """Add an output format (usable as a class decorator); its suffixes must be new ones."""
    taken = set(prefix_suffixes())
    clash = [s for s in cls.suffixes.values() if s in taken]
    if clash:
        raise ValueError(f"exporter {cls.__name__}: the suffix {clash[0]!r} is already an output name")
    EXPORTERS.append(cls)
    return cls


def exporters_for(opts: Any) -> list[Exporter]:
    """The exporters ``opts`` (a ``QuantizeOptions``) ask for, each made for this run."""
    made = [cls(opts) for cls in EXPORTERS]
    return [e for e in made if e.kinds()]


def prefix_suffixes() -> tuple[str, ...]:
    """The suffix of every file a calibrate run may write under its prefix: the job's own
    (config, record, report) and every exporter's."""
    out = list(JOB_SUFFIXES.values())
    for cls in EXPORTERS:
        out += [s for s in cls.suffixes.values() if s not in out]
    return tuple(out)


def prefix_outputs(prefix: str) -> list[str]:
    """Every output path a calibrate run may write under ``prefix``."""
    return [prefix + s for s in prefix_suffixes()]
