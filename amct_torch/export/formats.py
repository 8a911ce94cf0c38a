"""The output formats of the calibrate job: the registered exporters, in writing order, and
every file name a run under one output prefix may write.

Why one list: the job plans, checks, writes and cleans up by looping over it, and the names
it gathers are what the output transaction owns (a rerun removes the ones it does not write)
and what ``--help`` lists. Torch-free: the exporter classes import nothing heavy until used."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amct_torch.export.caffe.exporter import CaffeExporter
from amct_torch.export.exporter import Exporter
from amct_torch.export.onnx.exporter import OnnxExporter
from amct_torch.files.output_names import SUFFIXES as JOB_SUFFIXES
from amct_torch.files.output_names import output_path

__all__ = ["EXPORTERS", "OutputPlan", "check_exporter_options", "exporters_for", "plan_outputs", "planned_outputs",
           "prefix_outputs", "prefix_suffixes", "register_exporter"]

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


def check_exporter_options(opts: Any) -> None:
    """Every registered format's check of the options (``Exporter.check_options``), in order."""
    for cls in EXPORTERS:
        cls.check_options(opts)


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


@dataclass
class OutputPlan:
    """What one calibrate run writes: ``exporters``, the formats its options ask for (in
    writing order); ``finals``, kind -> absolute final path of every file it may write; and
    ``suffixes``, every name its prefix may hold (``prefix_suffixes``: what its transaction owns)."""

    exporters: list[Exporter]
    finals: dict[str, str]
    suffixes: tuple[str, ...]


def plan_outputs(opts: Any) -> OutputPlan:
    """The outputs of a calibrate run with ``opts`` (a validated ``QuantizeOptions``)."""
    exporters = exporters_for(opts)
    return OutputPlan(exporters, planned_outputs(opts.output, exporters, opts.report), prefix_suffixes())


def planned_outputs(output: str, exporters: Sequence[Exporter], report: bool) -> dict[str, str]:
    """kind -> final path of every file a calibrate run may write under the prefix ``output``:
    the config and the record, each exporter's kinds, the reports."""
    paths = {k: output_path(output, k) for k in ("config", "record")}
    paths.update((k, e.path(output, k)) for e in exporters for k in e.kinds())
    paths.update((k, output_path(output, k)) for k in (("report", "html_report") if report else ()))
    return {k: os.path.abspath(p) for k, p in paths.items()}
