"""What the one-call job returns."""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from amct_torch.steps import QuantGraph


@dataclass
class QuantizeResult:
    """What ``quantize`` produced.

    ``files``: kind → path of every file written (``record``, ``config``, ``fake_quant_model``,
    ``deploy_model``, ``onnx``, ``report``…); ``records``: the record as written (the values
    the file holds); ``float_model``/``quant_model``: the fused float torch model and its
    fake-quant twin (on ``device``); ``report``: per-layer ``LayerStat`` rows, worst first
    (None when not asked); ``graph``: the ``QuantGraph``.

    ``quant_model`` may be given as a ``Deferred``: it is then built on first access, once.
    Why: the fake-quant twin holds a second copy of every weight (a VGG-16: 0.5 GB and most of
    a second); the command without a report never reads it, a Python caller who does pays for
    it then."""

    files: dict[str, str]
    records: dict
    float_model: Any
    quant_model: Any = field(repr=False, compare=False)
    graph: QuantGraph
    report: Optional[list] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: torch.distributed rank (0 without distributed); ranks > 0 write nothing (``files`` empty)
    rank: int = 0
    #: samples that calibrated, and samples in the data (None when the data is an iterable)
    samples_used: Optional[int] = None
    samples_total: Optional[int] = None
    #: an earlier run's files of the output prefix that this run does not write, removed
    removed: list[str] = field(default_factory=list)
    #: with ``improve``: what each improvement stage did and cost (``Improvement.summary()``)
    improvement: Optional[dict] = None
    #: what the visual report (``files["html_report"]``) shows (``html_report.ReportInputs``)
    report_page: Any = field(default=None, repr=False, compare=False)

    def report_html(self, accuracy: Optional[Sequence[tuple[str, float, float]]] = None) -> str:
        """The visual report as an HTML fragment; ``accuracy``: (metric, float, int8) rows to
        show in its accuracy section (e.g. top-1 of both models on a labelled test set)."""
        from amct_torch.quality import render
        if self.report_page is None:
            return ("<p>amct_torch: no report for this run (report=False); files: "
                    + html.escape(", ".join(sorted(self.files))) + "</p>")
        if accuracy is not None:
            self.report_page.accuracy = list(accuracy)
        return render(self.report_page)

    def _repr_html_(self) -> str:
        """Jupyter shows the visual report inline."""
        return self.report_html()


class Deferred:
    """A value made by ``build()`` when first needed (see ``QuantizeResult.quant_model``)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build


def _get_quant_model(self: QuantizeResult) -> Any:
    value = self.__dict__["_quant_model"]
    if isinstance(value, Deferred):
        value = value.build()
        self.__dict__["_quant_model"] = value
    return value


def _set_quant_model(self: QuantizeResult, value: Any) -> None:
    self.__dict__["_quant_model"] = value


# after the dataclass is made: its __init__ assigns quant_model through the setter
QuantizeResult.quant_model = property(_get_quant_model, _set_quant_model,
                                      doc="The fake-quant twin of ``float_model`` (built on first access "
                                          "when the job deferred it).")
