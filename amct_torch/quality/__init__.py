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
    **{n: "amct_torch.quality.html_report" for n in ("check_page_path", "render", "write_page")},
    **{n: "amct_torch.quality.net_scores" for n in ("caffe_test", "format_result")},
    **{n: "amct_torch.quality.ap_versions" for n in ("AP_VERSIONS", "DEFAULT_AP_VERSION")},
    **{n: "amct_torch.quality.evaluate" for n in ("DEFAULT_BATCH", "format_stats")},
    **{n: "amct_torch.quality.report" for n in ("LayerStat", "format_table", "layer_report", "write_report")},
}

__all__ = ["AP_VERSIONS", "DEFAULT_AP_VERSION", "DEFAULT_BATCH", "AutoCalibrationEvaluatorBase", "LayerStat",
           "PendingReport", "accuracy_based_auto_calibration", "caffe_test", "check_page_path", "format_result",
           "format_stats", "format_table", "layer_report", "render", "write_job_report", "write_page",
           "write_report"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.quality.ap_versions import AP_VERSIONS, DEFAULT_AP_VERSION
    from amct_torch.quality.auto_calibration import AutoCalibrationEvaluatorBase, accuracy_based_auto_calibration
    from amct_torch.quality.evaluate import DEFAULT_BATCH, format_stats
    from amct_torch.quality.html_report import check_page_path, render, write_page
    from amct_torch.quality.job_report import PendingReport, write_job_report
    from amct_torch.quality.net_scores import caffe_test, format_result
    from amct_torch.quality.report import LayerStat, format_table, layer_report, write_report
