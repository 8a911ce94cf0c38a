"""``amct_torch.quantize``: the whole AMCT workflow in one call.

Why: most users do not want five calls and two intermediate files. This runs
create_quant_config → init → quantize_model → the calibration loop → save_model (+ ONNX, + the
per-layer report) with sensible defaults, and writes every output under one prefix. All work
happens in a staging folder beside the outputs and the results are committed together at the
end (``amct_torch.transaction``): a failure or a kill leaves no partial or mixed outputs.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

import torch

from amct_torch.export import fake_quant_graph
from amct_torch.calibration.data import Preprocess, calibration_batches, count_samples
from amct_torch.calibration.loop import resolve_device, run_calibration, take
from amct_torch.calibration.workflow import QuantGraph
from amct_torch.errors import AmctError, CalibrationError, ConfigError, DataError, ModelError
from amct_torch.transaction import OutputTransaction, check_outputs

log = logging.getLogger("amct_torch")


@dataclass
class QuantizeResult:
    """What ``quantize`` produced.

    ``files``: kind → path of every file written (``record``, ``config``, ``fake_quant_model``,
    ``deploy_model``, ``onnx``, ``report``…); ``records``: the record as read back;
    ``float_model``/``quant_model``: the fused float torch model and its fake-quant twin (on
    ``device``); ``report``: per-layer ``LayerStat`` rows, worst first (None when not asked);
    ``graph``: the ``QuantGraph``."""

    files: dict[str, str]
    records: dict
    float_model: Any
    quant_model: Any
    graph: QuantGraph
    report: Optional[list] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: torch.distributed rank (0 without distributed); ranks > 0 write nothing (``files`` empty)
    rank: int = 0
    #: samples that calibrated, and samples in the data (None when the data is an iterable)
    samples_used: Optional[int] = None
    samples_total: Optional[int] = None


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


#: most samples in one batch when the batch size is derived from the data (documented in
#: docs/workflow.md): beyond it the remaining samples stay unused, with a warning
MAX_DEFAULT_BATCH = 256


def default_batch_size(count: Optional[int], batch_num: int) -> Optional[int]:
    """Spread ``count`` samples over ``batch_num`` batches (at most ``MAX_DEFAULT_BATCH`` per
    batch); None (one sample per item) when the count is unknown."""
    if not count:
        return None
    return max(1, min(MAX_DEFAULT_BATCH, -(-count // batch_num)))


def _check_data_settings(data: Any, inputs: Any, pre: Optional[Preprocess], model_file: str) -> None:
    """Warn when --mean/--scale/--resize cannot apply (arrays are used as they are) and refuse
    a resize target beyond the image budget before any image is read."""
    from amct_torch.calibration.data import IMAGE_EXTS, check_resize
    if not isinstance(data, (str, os.PathLike)) or not inputs:
        return
    path = os.fspath(data)
    names = os.listdir(path) if os.path.isdir(path) else [path]
    images = any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names)
    pre = pre or Preprocess()
    if images:
        shape = inputs[0][1]
        hw = (int(shape[2]), int(shape[3])) if shape and len(shape) == 4 else None
        check_resize(hw, pre, model_file)
    elif pre.mean is not None or pre.scale != 1.0 or pre.resize is not None or pre.crop is not None:
        log.warning("--mean/--scale/--resize/--crop apply to images only: the arrays of %s are "
                    "used as they are", path)


def _fingerprint_run(graph: QuantGraph, model_file: str, data: Any, batch_num: int,
                     batch_size: Optional[int], pre: Optional[Preprocess], ifmr_mode: str) -> None:
    """What a checkpoint must share with this run to be resumed (checkpoint.py)."""
    import dataclasses
    import hashlib
    from amct_torch.calibration.checkpoint import describe_data, set_run_fingerprint
    from amct_torch.config.json_config import quant_config_to_json
    with open(model_file, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    set_run_fingerprint(graph.session, model=model_sha, config=quant_config_to_json(graph.config),
                        batch_num=batch_num, batch_size=batch_size, ifmr_mode=ifmr_mode,
                        preprocess=dataclasses.asdict(pre) if pre is not None else None,
                        data=describe_data(data))


def _report_use(keeper: "_Keep", count: Optional[int], batch_num: int, bs: Optional[int]) -> None:
    """Log how many samples calibrated and warn when some were left out."""
    if count is None:
        return
    if keeper.samples < count:
        log.warning("calibrated on %d of %d samples (%d batch(es) of %s): %d sample(s) unused; "
                    "raise --batch-num or --batch-size to use them", keeper.samples, count,
                    batch_num, bs, count - keeper.samples)
    else:
        log.info("calibrated on all %d samples", count)


def quantize(model_file: str, weights_file: str, calibration_data: Any,
             config: Optional[str] = None, output: str = "amct_output/model", *,
             batch_num: Optional[int] = None, batch_size: Optional[int] = None,
             device: Optional[str] = None, preprocess: Optional[Preprocess] = None,
             skip_layers: Optional[Sequence[str]] = None, activation_offset: bool = True,
             save_type: Optional[str] = "Both", onnx: Union[bool, str] = False,
             onnx_speed: bool = False, report: bool = True, report_data: Any = None, report_batches: int = 2, ifmr_mode: str = "streaming",
             quiet: bool = False, improve: Optional[str] = None, distributed: bool = False,
             checkpoint: Optional[str] = None,
             onnx_outputs: Optional[Sequence[str]] = None) -> QuantizeResult:
    """Quantize a Caffe model in one call and write every output under the prefix ``output``.

    ``calibration_data``: an iterable of batches (tensors/arrays N×C×H×W), one array of samples,
    or a path (folder of images or .npy/.npz files, or one .npy/.npz file; images are
    preprocessed by ``preprocess``). ``config``: None (defaults), a quant.cfg or a JSON quant
    config. ``batch_num`` overrides the config's; for an array or folder the default
    ``batch_size`` spreads the samples over ``batch_num`` batches. ``device`` defaults to CUDA
    when present. ``save_type`` as in ``save_model`` (None: record only); ``onnx`` (True, "int8" or
    "uint8": the activation type) also writes ``{output}_quant.onnx`` (QDQ) and
    ``{output}_float.onnx``; ``onnx_speed`` makes that QDQ model the opt-in speed mode
    (``export_onnx(quantize_eltwise=True)``: residual outputs and Eltwise SUMs quantized too so
    ONNX Runtime stays in int8 kernels — no longer AMCT-exact; pair it with "uint8"); ``report`` compares every quantized layer's output with the float
    model on ``report_data`` (default: up to ``report_batches`` batches of the calibration data
    not used for calibration, else the calibration batches) and writes
    ``{output}_layer_report.json``. ``improve``: None (AMCT's result) or an opt-in
    improvement beyond AMCT, one of ``IMPROVEMENTS``: "bias_correction" folds the sequential
    empirical bias correction of every quantized layer into the fused biases before anything
    is written (``calibration/bias_correction.py``); the factors stay AMCT's, ``float_model``
    stays the uncorrected float model.
    ``distributed``: under ``torchrun``, each process calibrates its share of the batches and
    rank 0 alone writes the outputs (docs/distributed.md); ``checkpoint``: a path where the
    observer states are saved after each batch, and resumed from when it exists.
    Files: ``{output}_quant_config.json``, ``{output}_record.txt`` and the models."""
    from amct_torch.api import SAVE_TYPES, init, quantize_model, save_model
    from amct_torch.calibration.outputs import export_onnx_model
    from amct_torch.export.preflight import onnx_preflight, raise_if

    for p, what in ((model_file, "model file"), (weights_file, "weights file")):
        if not isinstance(p, (str, os.PathLike)) or not os.path.isfile(p):
            raise ModelError(f"{what} not found", file=str(p))
    if save_type is not None and save_type not in SAVE_TYPES:
        raise AmctError(f"save_type must be one of {', '.join(SAVE_TYPES)} or None, got {save_type!r}")
    if onnx not in (False, None, True, "int8", "uint8"):
        raise AmctError(f"onnx must be True, False, 'int8' or 'uint8', got {onnx!r}")
    if batch_num is not None and (isinstance(batch_num, bool) or int(batch_num) < 1):
        raise ConfigError(f"batch_num must be >= 1, got {batch_num!r}")
    if improve is not None and improve not in IMPROVEMENTS:
        raise AmctError(f"improve must be one of {', '.join(IMPROVEMENTS)} or None, got {improve!r}")
    ctx = None
    if distributed:
        from amct_torch.calibration.distributed import init_distributed
        ctx = init_distributed(device)
    dev = ctx.device if ctx is not None and ctx.active else resolve_device(device)
    output = os.fspath(output)
    if not os.path.basename(output) or output.endswith(os.sep):
        raise AmctError("output must be a path prefix such as out/model, not a folder", file=output)
    finals = planned_outputs(output, save_type, onnx, report)
    inputs = [model_file, weights_file, config, checkpoint]
    if isinstance(calibration_data, (str, os.PathLike)):
        inputs.append(calibration_data)
    check_outputs(list(finals.values()), inputs)  # before any work
    tx = None
    if ctx is None or ctx.is_writer:
        tx = OutputTransaction(list(finals.values()), inputs).begin(os.path.basename(output))
        tmp = tx.staging
    else:  # ranks > 0 write nothing: private work folder
        tmp = tempfile.mkdtemp(prefix="amct_")
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    prefix = os.path.join(tmp, os.path.basename(output))
    from amct_torch.progress import JobProgress, progress_enabled
    prog = JobProgress(5 + bool(improve) + bool(onnx) + bool(report) + (save_type is not None),
                       progress_enabled(quiet))
    try:
        prog.start("reading the model")
        staged = {k: os.path.join(tmp, os.path.basename(p)) for k, p in finals.items()}
        cfg = _config_json(config, staged["config"], model_file, weights_file, skip_layers,
                           batch_num or 1, activation_offset)
        graph = init(cfg, model_file, weights_file, staged["record"])
        onnx_problem = onnx_preflight(graph.model, model_file, onnx_outputs, graph.config) if onnx else None  # before calibrating
        if batch_num is not None:
            graph.config.batch_num = int(batch_num)
        n = graph.config.batch_num
        prog.start("BN fusion + ARQ")
        model = quantize_model(graph, None, None, ifmr_mode=ifmr_mode)  # not kept: not written
        model.to(dev)
        prog.start("calibrating")
        inputs_decl = graph.model.caffe_inputs
        count = count_samples(calibration_data, inputs_decl)
        bs = batch_size if batch_size is not None else default_batch_size(count, n)
        _check_data_settings(calibration_data, inputs_decl, preprocess, model_file)
        batches = calibration_batches(calibration_data, inputs_decl, bs, preprocess)
        # all calibration batches only for what reads them again (bias correction, ONNX);
        # otherwise the report's fallback at most: 256 images at 224x224 are 154 MB
        keeper = _Keep(None if improve or onnx else (report_batches if report else 0))
        if checkpoint is not None:
            _fingerprint_run(graph, model_file, calibration_data, n, bs, preprocess, ifmr_mode)
        if ctx is not None or checkpoint is not None:
            from amct_torch.calibration.distributed import DistContext, run_sharded_calibration
            rest = run_sharded_calibration(model, graph.session, keeper(batches, n),
                                           ctx or DistContext(device=dev), quiet=quiet,
                                           checkpoint=checkpoint)
        else:
            rest = run_calibration(model, graph.session, keeper(batches, n), dev, quiet=quiet)
        _report_use(keeper, count, n, bs)
        if tx is None:  # only rank 0 writes; tmp is removed below
            return QuantizeResult(files={}, records=_records(graph, save_type), float_model=model,
                                  quant_model=None, graph=graph, device=dev, rank=ctx.rank)
        files = {"config": staged["config"], "record": staged["record"]}
        if cfg != staged["config"]:  # the user's JSON config, copied as it was read
            shutil.copyfile(cfg, staged["config"])
        records = _records(graph, save_type)
        if improve == "bias_correction":
            prog.start("bias correction")
            model = _bias_correct(graph, records, keeper.cache, dev)
        if save_type is not None:
            prog.start("writing the Caffe models")
            written = save_model(graph, save_type, prefix, _staged=True)
            for p in written:
                files[_kind(p, prefix)] = p
        prog.start("building the fake-quant model")
        quant_model = fake_quant_graph(graph.fused, records, graph.record_file).to(dev)
        if onnx and onnx_problem is None:
            prog.start("writing the ONNX models")
            activations = onnx if isinstance(onnx, str) else "uint8"  # same values, faster in ORT
            calib = [b[0] if isinstance(b, tuple) else b for b in keeper.cache]
            files["onnx_float"], files["onnx"] = export_onnx_model(
                graph, records, prefix, activations, quantize_eltwise=onnx_speed,
                calibration_data=[b.cpu().numpy() for b in calib], outputs=onnx_outputs)
        stats = None
        if report:
            prog.start("per-layer report")
            from amct_torch.report import layer_report, write_report
            held = take(rest, report_batches) if report_data is None else list(
                calibration_batches(report_data, graph.model.caffe_inputs, bs, preprocess))
            held_out = bool(held) or report_data is not None
            if not held:
                held = keeper.cache[:report_batches]
            stats = layer_report(model, quant_model, held, list(records), device=dev)
            files["report"] = staged["report"]
            write_report(files["report"], stats, {"model": model_file, "held_out": held_out,
                                                  "batches": len(held)})
        graph.record_file = finals["record"]
        prog.start("committing the outputs")
        tx.commit([finals[k] for k in files])
        final = {k: finals[k] for k in files}
        raise_if(onnx_problem)  # the other outputs are written: now the ONNX problem (exit 2)
        return QuantizeResult(files=final, records=records, float_model=model,
                              quant_model=quant_model, graph=graph, report=stats, device=dev,
                              samples_used=keeper.samples, samples_total=count)
    except (CalibrationError, DataError) as err:
        if err.file is None and isinstance(calibration_data, (str, os.PathLike)):
            # weights are checked for NaN/Inf up front: what is left comes from the data
            raise err.with_file(os.fspath(calibration_data)) from None
        raise _user_paths(err, tmp, finals, config, weights_file, calibration_data) from None
    except AmctError as err:
        raise _user_paths(err, tmp, finals, config, weights_file, calibration_data) from None
    except OSError as err:
        # a full disk or a vanished folder while writing: name the output, never the staging copy
        where = err.filename if isinstance(err.filename, str) else None
        ours = where is None or os.path.abspath(where).startswith(os.path.abspath(tmp) + os.sep)
        if where is not None and tx is not None:
            where = tx.final_of(where)
        what = "cannot write the outputs" if ours else "cannot read or write this file"
        raise AmctError(f"{what}: {err.strerror or err}",
                        file=where or os.path.dirname(os.path.abspath(output))) from None
    finally:
        prog.close()
        if tx is not None:
            tx.abort()
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def planned_outputs(output: str, save_type: Optional[str], onnx: Any, report: bool) -> dict[str, str]:
    """kind → final path of every file ``quantize`` may write under the prefix ``output``."""
    from amct_torch.calibration.outputs import output_paths
    out = {"config": output + "_quant_config.json", "record": output + "_record.txt"}
    if save_type is not None:
        for p in output_paths(output, save_type):
            out[_kind(p, output)] = p
    if onnx:
        out["onnx_float"], out["onnx"] = output + "_float.onnx", output + "_quant.onnx"
    if report:
        out["report"] = output + "_layer_report.json"
    return {k: os.path.abspath(p) for k, p in out.items()}


def _user_paths(err: AmctError, tmp: str, finals: dict[str, str], config: Optional[str],
                weights_file: Optional[str] = None, data: Any = None) -> AmctError:
    """An error that names a file of the private work folder names the user's file instead:
    the config it was made from; for the record this run computes, the weights (weight
    factors) or the data (activation factors) its values came from; else the final path."""
    if err.file is None or os.path.dirname(os.path.abspath(err.file)) not in (
            os.path.abspath(tmp), os.path.join(os.path.abspath(tmp), "work")):
        return err
    base = os.path.basename(err.file)
    if base == os.path.basename(finals["config"]) and config is not None:
        return err.with_file(config)
    if base == os.path.basename(finals["record"]):
        source = weights_file if ("scale_w" in err.message or "offset_w" in err.message) else (
            os.fspath(data) if isinstance(data, (str, os.PathLike)) else None)
        err.message = f"computed factors: {err.message}"
        return err.with_file(source)
    for p in finals.values():
        if os.path.basename(p) == base:
            return err.with_file(p)
    return err.with_file(None)


IMPROVEMENTS = ("bias_correction",)


def _bias_correct(graph: QuantGraph, records: dict, batches: list, dev: torch.device) -> Any:
    """Fold the bias correction into ``graph.fused`` (what every output is written from) and
    return an uncorrected copy of it: the float model the report and the caller compare with."""
    import copy
    from amct_torch.calibration.bias_correction import correct_biases

    float_model = copy.deepcopy(graph.fused)
    correct_biases(graph.fused, records, batches, dev)
    return float_model


class _Keep:
    """Remembers the first ``n`` batches it passes on (the fallback report data; at most
    ``limit`` of them when given) and counts their samples."""

    def __init__(self, limit: Optional[int] = None) -> None:
        self.cache: list = []
        self.samples = 0
        self.limit = limit

    def __call__(self, batches: Iterable[Any], n: int) -> Iterable[Any]:
        self.cache = []
        self.samples = 0
        for i, b in enumerate(batches):
            if i < n:
                if self.limit is None or len(self.cache) < self.limit:
                    self.cache.append(b)
                first = b[0] if isinstance(b, tuple) else b
                self.samples += int(first.shape[0]) if getattr(first, "dim", lambda: 0)() else 1
            yield b



def _records(graph: QuantGraph, save_type: Optional[str]) -> dict:
    from amct_torch.api import checked_records
    return checked_records(graph)


def _kind(path: str, prefix: str) -> str:
    tail = path[len(prefix) + 1:] if path.startswith(prefix + "_") else os.path.basename(path)
    return tail.rsplit(".", 1)[0]
