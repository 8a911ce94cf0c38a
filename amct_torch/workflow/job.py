"""``amct_torch.quantize``: the whole AMCT workflow in one call.

Why: most users do not want five calls and two intermediate files. The job runs the AMCT steps
(``amct_torch.steps``) with the data loading, the calibration loop, the per-layer report and the
exporters, over one ``QuantizeOptions``, in four steps: plan (validate, open the output
transaction), load and check (the model, the config and every option, ONNX included, before any
calibration), calibrate (the record stays in memory), write. Every file is committed together at
the end (``amct_torch.files.transaction``): a failure or a kill publishes no file of the run."""
from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from amct_torch.arguments import checked
from amct_torch.calibration import resolve_device, run_calibration
from amct_torch.errors import AmctError, CalibrationError, ConfigError, DataError, ExportError, RecordError
from amct_torch.export import Exporter, ExportInputs, fake_quant_graph, plan_outputs
from amct_torch.files import OutputTransaction, open_outputs, user_path, write_error
from amct_torch.inputs import BatchPlan, Preprocess, plan_batches
from amct_torch.record import LayerRecord
from amct_torch.steps import (
    QuantGraph,
    calibrated_records,
    check_records,
    load,
    quantize_weights,
    start_calibration,
    write_records,
)
from amct_torch.workflow.options import ARGUMENTS_DOC, QUANTIZE_ARGS, QuantizeOptions
from amct_torch.workflow.result import Deferred, QuantizeResult
from amct_torch.workflow.side_by_side import side_by_side

log = logging.getLogger("amct_torch")


@checked(**QUANTIZE_ARGS)
def quantize(model_file: str, weights_file: str, calibration_data: Any = None,
             config: Optional[str] = None, output: str = "amct_output/model", *,
             batch_num: Optional[int] = None, batch_size: Optional[int] = None,
             device: Optional[str] = None, preprocess: Optional[Preprocess] = None,
             skip_layers: Optional[Sequence[str]] = None, activation_offset: bool = True,
             save_type: Optional[str] = "Both", onnx: Union[bool, str] = False,
             onnx_speed: bool = False, report: bool = True, report_data: Any = None,
             report_batches: int = 2, ifmr_mode: str = "streaming",
             quiet: bool = False, improve: Union[None, str, Sequence[str]] = None, distributed: bool = False,
             checkpoint: Optional[str] = None,
             onnx_outputs: Optional[Sequence[str]] = None, onnx_target: str = "onnxruntime",
             allow_unknown_fields: bool = False) -> QuantizeResult:
    """Quantize a Caffe model in one call and write every output under the prefix ``output``
    (docs/workflow.md); returns what was written and calibrated.

    Arguments (each a ``QuantizeOptions`` field, documented with its declaration):
    """
    return run(QuantizeOptions(
        model_file=model_file, weights_file=weights_file, calibration_data=calibration_data,
        config=config, output=output, batch_num=batch_num, batch_size=batch_size, device=device,
        preprocess=preprocess, skip_layers=skip_layers, activation_offset=activation_offset,
        save_type=save_type, onnx=onnx, onnx_speed=onnx_speed, onnx_outputs=onnx_outputs,
        report=report, report_data=report_data, report_batches=report_batches, ifmr_mode=ifmr_mode,
        quiet=quiet, improve=improve, distributed=distributed, checkpoint=checkpoint,
        onnx_target=onnx_target, allow_unknown_fields=allow_unknown_fields))


if quantize.__doc__:  # None under python -OO
    quantize.__doc__ = quantize.__doc__.rstrip() + "\n" + ARGUMENTS_DOC + "\n"


@dataclass
class _Plan:
    """Where the job runs and writes: the distributed context, the device, the final and
    staged path of every output, the transaction (None on ranks > 0), the work folder and the
    exporters of the formats asked for."""

    ctx: Any
    device: torch.device
    finals: dict
    staged: dict
    tx: Optional[OutputTransaction]
    tmp: str
    prefix: str
    exporters: list[Exporter]  # the output formats this run writes, in writing order
    data: Optional[BatchPlan] = None  # the calibration data's batches (made once the model is loaded)


@dataclass
class _Calibrated:
    """What calibration leaves for the writing step: the graph and its validated record."""

    graph: QuantGraph
    model: Any
    data: BatchPlan
    config_file: str
    records: dict[str, LayerRecord]


def run(opts: QuantizeOptions) -> QuantizeResult:
    """The job for ``opts``: plan, load and check, calibrate, write; every error names the
    user's files."""
    from amct_torch.caffe import allow_unknown_fields
    with allow_unknown_fields(opts.allow_unknown_fields):
        return _run(opts)


def _run(opts: QuantizeOptions) -> QuantizeResult:
    from amct_torch.runtime import JobProgress, progress_enabled

    plan = _plan(opts.validate())
    writes = bool(plan.exporters)  # one phase: side by side
    prog = JobProgress(4 + bool(opts.improve) + writes + 2 * bool(opts.report), progress_enabled(opts.quiet))
    try:
        graph, config_file = _load_and_check(opts, plan, prog)
        cal = _calibrate(opts, plan, graph, config_file, prog)
        if plan.tx is None:  # only rank 0 writes; its work folder is removed below
            return QuantizeResult(files={}, records=cal.records, float_model=cal.model, quant_model=None,
                                  graph=cal.graph, device=plan.device, rank=plan.ctx.rank)
        return _write(opts, plan, plan.tx, cal, prog)
    except (CalibrationError, DataError) as err:
        if err.file is None and opts.data_path:
            # weights are checked for NaN/Inf up front: what is left comes from the data
            raise err.with_file(opts.data_path) from None
        raise
    except (RecordError, ExportError) as err:
        if err.file is None and err.layer is not None:
            raise _computed_factors(err, opts) from None
        raise
    except OSError as err:
        if isinstance(err, AmctError):  # already one line naming the user's output
            raise
        # a full disk or a vanished folder while writing: name the output, never the staging copy
        where = err.filename if isinstance(err.filename, str) else None
        ours = where is None or os.path.abspath(where).startswith(os.path.abspath(plan.tmp) + os.sep) \
            or user_path(where) != where
        if ours:  # the user's output, never the staging copy or a temporary file
            raise write_error(err, user_path(where) if where else opts.output) from None
        raise AmctError(f"cannot read or write this file: {err.strerror or err}", file=where) from None
    finally:
        _close(plan, prog)


def _close(plan: _Plan, prog) -> None:
    """The job's way out, each step run even when one before it fails: the progress bar, the
    net's data layers (their databases and decoding threads), the exporters (their threads
    stopped, their files gone unless committed), then the staging or work folder."""
    try:
        prog.close()
    finally:
        try:
            if plan.data is not None:
                plan.data.close()
        finally:
            try:
                _discard(plan.exporters)
            finally:
                if plan.tx is not None:
                    plan.tx.abort()
                else:
                    shutil.rmtree(plan.tmp, ignore_errors=True)


def _plan(opts: QuantizeOptions) -> _Plan:
    """The device and the outputs; refuses outputs that are inputs or folders before any work,
    and opens the output transaction (rank 0 only)."""
    ctx = None
    if opts.distributed:
        from amct_torch.calibration import init_distributed
        ctx = init_distributed(opts.device)
    dev = ctx.device if ctx is not None and ctx.active else resolve_device(opts.device)
    outputs = plan_outputs(opts)
    finals = outputs.finals
    tx = open_outputs(list(finals.values()), opts.inputs, name=os.path.basename(opts.output),
                      owns_prefix=opts.output, known_suffixes=outputs.suffixes,
                      writer=ctx is None or ctx.is_writer)
    if tx is not None:
        assert tx.staging is not None  # begun
        tmp = tx.staging
    else:  # ranks > 0 write nothing: private work folder
        tmp = tempfile.mkdtemp(prefix="amct_")
    staged = {k: os.path.join(tmp, os.path.basename(p)) for k, p in finals.items()}
    return _Plan(ctx, dev, finals, staged, tx, tmp, os.path.join(tmp, os.path.basename(opts.output)),
                 outputs.exporters)


def _load_and_check(opts: QuantizeOptions, plan: _Plan, prog) -> tuple[QuantGraph, str]:
    """The end of planning: the quant config (written from a quant.cfg or the defaults, or the
    user's JSON) and the model, then every option checked against them before any calibration
    work: each exporter's check (the ONNX one builds both models in memory as it will write
    them: layer mappings, ``onnx_outputs`` blob names, the QDQ form, the checker); a problem is
    an ``AmctError`` naming the user's file, and nothing of the run is published."""
    prog.start("reading the model")
    cfg = _config_json(opts.config, plan.staged["config"], opts.model_file, opts.weights_file, opts.skip_layers,
                       opts.batch_num or 1, opts.activation_offset)
    try:
        graph = load(cfg, opts.model_file, opts.weights_file)
    except ConfigError as err:
        if err.file == cfg and cfg != opts.config:  # the JSON this run made from the user's quant.cfg
            raise err.with_file(opts.config) from None
        raise
    # the net's own data layers (without calibration data) are opened here, before any other check
    plan.data = plan_batches(graph.model, opts.calibration_data, model_file=opts.model_file, device=plan.device,
                             batch_size=opts.batch_size, preprocess=opts.preprocess,
                             report_batches=opts.report_batches if opts.report else 0,
                             report_data=opts.report_data, guard=bool(opts.improve),
                             keep_all=bool(opts.improve) or any(e.reads_batches for e in plan.exporters))
    for exporter in plan.exporters:  # each imports its heavy packages only here (onnx: --onnx)
        exporter.check(graph)
    if opts.batch_num is not None:
        graph.config.batch_num = int(opts.batch_num)
    return graph, cfg


def _calibrate(opts: QuantizeOptions, plan: _Plan, graph: QuantGraph, config_file: str, prog) -> _Calibrated:
    """Fuse + ARQ, run the calibration batches, and check the record (in memory) once."""
    n = graph.config.batch_num
    prog.start("BN fusion + ARQ")
    quantize_weights(graph)
    if plan.tx is not None:  # what needs no calibration (ONNX: the float model), built before the observers
        for exporter in plan.exporters:
            exporter.prepare(graph.fused, plan.prefix)
    session = start_calibration(graph, ifmr_mode=opts.ifmr_mode, summaries=opts.report)  # read by the report only
    model = graph.fused.to(plan.device)
    prog.start("calibrating")
    data = plan.data
    assert data is not None  # made by _load_and_check
    batches = data.calibration_batches(n)  # the data and memory checks first
    if opts.checkpoint is not None:
        _fingerprint_run(graph, opts, n, data.batch_size)
    for exporter in plan.exporters:  # written beside the calibration, once the data checks passed
        exporter.start()
    data.calibrated(run_calibration(model, session, batches, plan.device, quiet=opts.quiet,
                                    ctx=plan.ctx, checkpoint=opts.checkpoint))
    records = calibrated_records(graph)
    return _Calibrated(graph, model, data, config_file, records)


def _write(opts: QuantizeOptions, plan: _Plan, tx: OutputTransaction, cal: _Calibrated, prog) -> QuantizeResult:
    """Every output into the staging folder -- the record written once, from memory -- then
    one commit."""
    graph, model, staged, records = cal.graph, cal.model, plan.staged, cal.records
    files = {"config": staged["config"], "record": staged["record"]}
    if cal.config_file != staged["config"]:  # the user's JSON config, copied as it was read
        shutil.copyfile(cal.config_file, staged["config"])
    improved = None
    if opts.improve:  # graph.fused becomes the improved model; model stays the float one
        from amct_torch.improve import improve_graph
        prog.start("improving: " + ", ".join(opts.improve))
        improved = improve_graph(graph, records, cal.data.cache, plan.device, opts.improve, opts.ifmr_mode,
                                 cal.data.guard_batches())
        records = check_records(graph, improved.records, None)
    write_records(records, staged["record"])
    inputs = ExportInputs(graph, records, plan.prefix, float_model=model if improved is not None else None,
                          batches=cal.data.cache)
    if plan.exporters:
        prog.start(f"writing the {_joined([e.label for e in plan.exporters])} models")
    # side by side: each one's waits (framing, the disk, ONNX Runtime's check) overlap
    for written in side_by_side(*(functools.partial(e.write, inputs) for e in plan.exporters)):
        files.update(written)
    # the fake-quant twin (a second copy of every weight) only when something reads it: the
    # report now, a caller of the result on first access; after the ONNX models either way, so
    # that the export never holds its weights beside its own
    fused, device = graph.fused, plan.device
    quant_model: Any = Deferred(lambda: fake_quant_graph(fused, records).to(device))
    stats = page = None
    if opts.report:
        prog.start("building the fake-quant model")
        quant_model = quant_model.build()
        prog.start("per-layer report")
        stats, page = _report(opts, plan, cal, improved.reference if improved is not None else model,
                              quant_model, records, files,
                              improved.summary() if improved is not None else None, prog.times)
    prog.start("committing the outputs")
    published = tx.commit([plan.finals[k] for k in files])  # an earlier run's others go
    graph.record_file = plan.finals["record"]  # save_model(result.graph, ...) reads it
    final = {k: plan.finals[k] for k in files}
    return QuantizeResult(files=final, records=records, float_model=model,
                          quant_model=quant_model, graph=graph, report=stats, device=plan.device,
                          samples_used=cal.data.samples, samples_total=cal.data.count,
                          removed=published.removed, report_page=page,
                          improvement=improved.summary() if improved is not None else None)


def _report(opts: QuantizeOptions, plan: _Plan, cal: _Calibrated, model, quant_model, records, files,
            improvement: Optional[dict] = None, timings: Optional[dict] = None) -> tuple[list, Any]:
    """The per-layer report on held-out batches (else the calibration batches), written as
    JSON and as the visual report (returned for the result's Jupyter view)."""
    from amct_torch.quality import write_job_report

    held, held_out = cal.data.report_batches()
    files["report"], files["html_report"] = plan.staged["report"], plan.staged["html_report"]
    return write_job_report(opts, cal.graph, records, model, quant_model, held, {k: plan.finals[k] for k in files},
                            report=files["report"], html_report=files["html_report"], held_out=held_out,
                            improvement=improvement, timings=timings, device=plan.device, fused=cal.graph.fused,
                            data_path=opts.data_path, samples_used=cal.data.samples,
                            samples_total=cal.data.count, batch_size=cal.data.batch_size)


def _joined(labels: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _discard(exporters: Sequence[Exporter]) -> None:
    """Every exporter's ``discard``, each one tried; the first error is raised after."""
    first: Optional[BaseException] = None
    for exporter in exporters:
        try:
            exporter.discard()
        except BaseException as err:  # noqa: BLE001 - raised below, once every one was tried
            first = first or err
    if first is not None:
        raise first


def _config_json(config: Optional[str], path: str, model_file: str, weights_file: str,
                 skip_layers: Optional[Sequence[str]], batch_num: int,
                 activation_offset: bool) -> str:
    """The JSON quant config to use: written at ``path`` from a quant.cfg or defaults, or the
    user's JSON file itself (read in place, so that its errors name it)."""
    from amct_torch.config import create_quant_config

    if config is None:
        create_quant_config(path, model_file, weights_file, skip_layers=skip_layers,
                            batch_num=batch_num, activation_offset=activation_offset)
        return path
    if not os.path.isfile(config):
        raise ConfigError("quant config not found", file=config)
    if config.lower().endswith(".json"):
        return config
    if skip_layers:
        log.warning("skip_layers is ignored: the quant.cfg %s decides what is skipped", config)
    create_quant_config(path, model_file, weights_file, config_defination=config)
    return path


def _fingerprint_run(graph: QuantGraph, opts: QuantizeOptions, batch_num: int, batch_size: Optional[int]) -> None:
    """What a checkpoint must share with this run to be resumed (checkpoint.py)."""
    import dataclasses
    import hashlib

    from amct_torch.calibration import describe_data, set_run_fingerprint
    from amct_torch.config import quant_config_to_json
    with open(opts.model_file, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    pre = opts.preprocess
    set_run_fingerprint(graph.session, model=model_sha, config=quant_config_to_json(graph.config),
                        batch_num=batch_num, batch_size=batch_size, ifmr_mode=opts.ifmr_mode,
                        preprocess=dataclasses.asdict(pre) if pre is not None else None,
                        data=describe_data(opts.calibration_data))


def _computed_factors(err: AmctError, opts: QuantizeOptions) -> AmctError:
    """An error about the factors this run computed (in memory: no file to name) names the
    user's file they came from: the caffemodel for the weight factors, else the calibration
    data."""
    weights = "scale_w" in err.message or "offset_w" in err.message
    err.message = f"computed factors: {err.message}"
    return err.with_file(opts.weights_file if weights else opts.data_path)
