"""Quality tools: how close a quantized model is to the float one (the per-layer report,
``evaluate``), ``caffe test``'s numbers without Caffe, and AMCT's accuracy-based auto
calibration that acts on them.

Names are imported on first use (module ``__getattr__``): the command line lists the
subcommands without importing torch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    **{n: "amct_torch.quality.auto_calibration"
       for n in ("AutoCalibrationEvaluatorBase", "accuracy_based_auto_calibration")},
    "PendingReport": "amct_torch.quality.job_report", "write_job_report": "amct_torch.quality.job_report",
    "render": "amct_torch.quality.html_report",
    "caffe_test": "amct_torch.quality.net_scores",
    **{n: "amct_torch.quality.report" for n in ("LayerStat", "format_table", "layer_report", "write_report")},
}

__all__ = ["AutoCalibrationEvaluatorBase", "LayerStat", "PendingReport", "accuracy_based_auto_calibration",
           "caffe_test", "format_table", "layer_report", "render", "write_job_report", "write_report"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.quality.auto_calibration import AutoCalibrationEvaluatorBase, accuracy_based_auto_calibration
    from amct_torch.quality.html_report import render
    from amct_torch.quality.job_report import PendingReport, write_job_report
    from amct_torch.quality.net_scores import caffe_test
    from amct_torch.quality.report import LayerStat, format_table, layer_report, write_report
