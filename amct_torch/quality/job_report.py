"""The one-call job's per-layer report: its figures, the JSON report and the visual report
(``html_report.ReportInputs``, gathered from the job's options, graph, record and figures),
written in one call."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from amct_torch.quality.html_report import ReportInputs, float_layers, weight_ranges


def _data(data: Any, data_path: Optional[str], used: Optional[int], total: Optional[int]) -> str:
    what = data_path or f"in-memory {type(data).__name__}"
    if used is not None:
        what += f" ({used} sample(s) calibrated" + (f" of {total})" if total is not None else ")")
    return what


def _algorithms(config: Any) -> dict[str, str]:
    """How many enabled layers use each activation and weight algorithm."""
    layers = [c for c in config.layers.values() if c.quant_enable]
    act = Counter(c.act_algo.upper() for c in layers)
    wts = Counter(f"{c.wts_algo.upper()} {'per channel' if c.channel_wise else 'per tensor'}" for c in layers)
    return {"activations": ", ".join(f"{k} × {v}" for k, v in act.items()),
            "weights": ", ".join(f"{k} × {v}" for k, v in wts.items())}


def job_report_inputs(opts: Any, graph: Any, records: Mapping[str, Any], stats: Sequence[Any],
                      files: Mapping[str, str], timings: Mapping[str, float], *, fused: Any,
                      data_path: Optional[str] = None, samples_used: Optional[int] = None,
                      samples_total: Optional[int] = None, batch_size: Optional[int] = None,
                      held_out: bool = True, batches: int = 0, improvement: Optional[dict] = None,
                      device: Any = None) -> ReportInputs:
    """The report of a ``quantize`` run: ``fused`` is the model the record quantizes (the
    improved one when an improvement was kept); ``files`` the final paths; ``data_path`` the
    calibration data's path (None: in memory)."""
    from amct_torch.caffe.graph import layer_modules

    cfg = graph.config
    settings = {"batch_num": cfg.batch_num, "batch size": batch_size if batch_size is not None else "as given",
                "activation offset": cfg.activation_offset, "IFMR mode": opts.ifmr_mode,
                "device": str(device) if device is not None else "",
                "report data": f"{batches} batch(es), {'held out from' if held_out else 'the same as'} calibration",
                "improve": ", ".join(opts.improve) if opts.improve else "none"}
    types = {n: m.caffe_type for n, m in layer_modules(fused).items()}
    return ReportInputs(
        model_file=opts.model_file, weights_file=opts.weights_file,
        data=_data(opts.calibration_data, data_path, samples_used, samples_total),
        config=files.get("config", str(opts.config)),
        settings=settings, algorithms=_algorithms(cfg), timings=dict(timings), files=dict(files),
        stats=list(stats), records=records, types=types,
        summaries=graph.session.summaries if graph.session is not None else {},
        weights=weight_ranges(fused, records), floats=float_layers(graph, records), improvement=improvement)


class PendingReport:
    """The job's visual report under way: its inputs gathered now (all but the per-layer
    figures) and, on a helper thread, the layer charts drawn while the job computes those
    figures (the float and fake-quant forwards mostly wait on torch's kernels, which leave
    Python free). Over ``MAX_LAYER_CHARTS`` layers the charts wait for the figures, which pick
    the worst layers to draw."""

    def __init__(self, opts: Any, graph: Any, records: Mapping[str, Any], files: Mapping[str, str],
                 timings: Mapping[str, float], **kw: Any) -> None:
        from amct_torch.quality.html_report import MAX_LAYER_CHARTS, render_charts
        from amct_torch.runtime.helper_thread import HelperThread

        self._timings = timings
        self.inputs = job_report_inputs(opts, graph, records, (), files, timings, **kw)
        self._thread = None
        if len(records) <= MAX_LAYER_CHARTS:
            self._thread = HelperThread(lambda: render_charts(self.inputs), "amct-report-charts")

    def write(self, path: str, stats: Sequence[Any]) -> ReportInputs:
        """Add the per-layer figures and write the page at ``path``; returns its inputs, charts
        drawn (the result's Jupyter view renders them again without redrawing)."""
        from amct_torch.quality import charts
        from amct_torch.quality.html_report import COSINE_WARN, write_html

        inp = self.inputs
        if self._thread is not None:
            self._thread.wait()  # before the figures go in: the thread reads the inputs
            if self._thread.error is not None:
                raise self._thread.error
            inp.charts = self._thread.result
        inp.stats, inp.timings = list(stats), dict(self._timings)
        if self._thread is not None and inp.charts and inp.stats:
            inp.charts["errors"] = charts.error_chart(inp.stats, [f[0] for f in inp.floats], COSINE_WARN)
        write_html(path, inp)
        return inp


def write_job_report(opts: Any, graph: Any, records: Mapping[str, Any], model: Any, quant_model: Any,
                     held: Sequence[Any], files: Mapping[str, str], *, report: str, html_report: str,
                     held_out: bool, improvement: Optional[dict] = None,
                     timings: Optional[Mapping[str, float]] = None, device: Any = None,
                     **kw: Any) -> tuple[list, ReportInputs]:
    """The per-layer report of a ``quantize`` run: ``model`` against ``quant_model`` on the
    ``held`` batches (``held_out``: not calibrated on), written as JSON at ``report`` and as
    the visual report at ``html_report`` (its charts drawn while the figures are computed);
    ``files``: the final path of every output. ``kw``: ``job_report_inputs``'s. Returns the
    figures and the page's inputs (the result's Jupyter view)."""
    from amct_torch.quality.report import layer_report, write_report

    page = PendingReport(opts, graph, records, files, timings or {}, held_out=held_out, batches=len(held),
                         improvement=improvement, device=device, **kw)
    stats = layer_report(model, quant_model, held, list(records), device=device)
    meta = {"model": opts.model_file, "held_out": held_out, "batches": len(held)}
    if improvement is not None:  # what each improvement did (dB on its held-out rows) and cost (s)
        meta["improve"] = improvement
    write_report(report, stats, meta)
    return stats, page.write(html_report, stats)
