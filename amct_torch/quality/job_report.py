"""What the one-call job puts in its visual report, gathered from the job's options, graph,
record and per-layer figures (``html_report.ReportInputs``)."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Optional, Sequence

from amct_torch.quality.html_report import ReportInputs, float_layers, weight_ranges


def _data(opts: Any, used: Optional[int], total: Optional[int]) -> str:
    what = opts.data_path or f"in-memory {type(opts.calibration_data).__name__}"
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
                      samples_used: Optional[int] = None, samples_total: Optional[int] = None,
                      batch_size: Optional[int] = None, held_out: bool = True, batches: int = 0,
                      improvement: Optional[dict] = None, device: Any = None) -> ReportInputs:
    """The report of a ``quantize`` run: ``fused`` is the model the record quantizes (the
    improved one when an improvement was kept); ``files`` the final paths."""
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
        data=_data(opts, samples_used, samples_total), config=files.get("config", str(opts.config)),
        settings=settings, algorithms=_algorithms(cfg), timings=dict(timings), files=dict(files),
        stats=list(stats), records=records, types=types,
        summaries=graph.session.summaries if graph.session is not None else {},
        weights=weight_ranges(fused, records), floats=float_layers(graph, records), improvement=improvement)


def write_job_html(path: str, opts: Any, graph: Any, records: Mapping[str, Any], stats: Sequence[Any],
                   files: Mapping[str, str], timings: Mapping[str, float], **kw: Any) -> ReportInputs:
    """Write the job's visual report at ``path`` (``files``: the final paths, this one
    included); returns its inputs, charts drawn (the result's Jupyter view renders them again
    without redrawing)."""
    from amct_torch.quality.html_report import write_html

    inputs = job_report_inputs(opts, graph, records, stats, files, timings, **kw)
    write_html(path, inputs)
    return inputs
