"""The AMCT-compatible Python API: ``create_quant_config``, ``init``, ``quantize_model``,
``save_model``, ``convert_model`` -- same names, arguments and files as ``amct_caffe``. The
one-call ``quantize`` is the workflow layer above this one (``amct_torch.workflow``).

Why a thin layer: the work is done by ``amct_torch.steps`` over an in-memory graph and record;
this module adds AMCT's argument checks and its files: ``init`` empties the record file,
``quantize_model`` writes the weight factors into it, the ``batch_num``-th forward rewrites it
with the activation factors, and ``save_model`` reads it back (a record edited by hand in
between is what the models are written from, as with AMCT). A typical script: README."""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from amct_torch.arguments import checked, instance, one_of, opt, path_arg
from amct_torch.caffe import allow_unknown_fields as unknown_fields_within
from amct_torch.config import create_quant_config
from amct_torch.errors import AmctError, CalibrationError, ConfigError, ModelError, RecordError
from amct_torch.export import SAVE_TYPES, model_paths, prefix_suffixes
from amct_torch.files import OutputTransaction, check_output_name, check_outputs, make_folder
from amct_torch.inputs import check_regular_file
from amct_torch.record import empty_record, read_record
from amct_torch.steps import QuantGraph, check_records, load, quantize_weights, start_calibration, write_records

log = logging.getLogger("amct_torch")

__all__ = ["create_quant_config", "init", "quantize_model", "save_model", "convert_model",
           "QuantGraph", "SAVE_TYPES"]


def _need_file(path: str, what: str, err: type = ModelError) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise err(f"{what} must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    check_regular_file(path, what, err)
    return path


def _output_path(path: object, what: str) -> str:
    """An output path or prefix given by the user, as a string (``AmctError`` otherwise)."""
    return check_output_name(path, what, prefix_suffixes())


@checked(config_file=path_arg, model_file=path_arg, weights_file=path_arg,
         scale_offset_record_file=path_arg)
def init(config_file: str, model_file: str, weights_file: str,
         scale_offset_record_file: str, *, allow_unknown_fields: bool = False) -> QuantGraph:
    """Load the Caffe model, read and validate the JSON quant config, and create (or empty)
    the record file. Returns the graph object the next calls take. A prototxt field the tool
    does not read is refused unless ``allow_unknown_fields``."""
    model_file = _need_file(model_file, "model file")
    weights_file = _need_file(weights_file, "weights file")
    config_file = _need_file(config_file, "quant config", ConfigError)
    record_file = _output_path(scale_offset_record_file, "record file")
    check_outputs([record_file], [model_file, weights_file, config_file])
    make_folder(os.path.dirname(os.path.abspath(record_file)))
    with unknown_fields_within(allow_unknown_fields):
        graph = load(config_file, model_file, weights_file)
    graph.record_file = record_file
    empty_record(record_file)
    return graph


@checked(graph=instance(QuantGraph, what="the graph returned by init()"),
         modified_model_file=opt(path_arg), modified_weights_file=opt(path_arg),
         ifmr_mode=one_of("streaming", "exact"))
def quantize_model(graph: QuantGraph, modified_model_file: Optional[str], modified_weights_file: Optional[str],
                   *, ifmr_mode: str = "streaming") -> torch.nn.Module:
    """Fuse BN, write ARQ weight factors to the record, write the modified (fused, calibration)
    Caffe model, and return the torch module to run on ``batch_num`` calibration batches.
    Both file names None: the modified model is not written.

    After the ``batch_num``-th forward the activation factors are computed and merged into the
    record file; later forwards do nothing more. ``ifmr_mode`` "streaming" (default, memory
    does not grow with batch_num) or "exact" (AMCT's keep-every-element search)."""
    from amct_torch.caffe import save_caffe

    if graph.session is not None:
        raise CalibrationError("quantize_model was already called on this graph; call init again")
    if graph.record_file is None:
        raise AmctError("quantize_model takes the graph returned by init() (it has no record file)")
    write = not (modified_model_file is None and modified_weights_file is None)
    outs = [_output_path(modified_model_file, "modified model"),
            _output_path(modified_weights_file, "modified weights")] if write else []
    check_outputs(outs, [graph.model_file, graph.weights_file, graph.config_file, graph.record_file])
    for p in outs:
        make_folder(os.path.dirname(os.path.abspath(p)))
    record_file = graph.record_file
    write_records(quantize_weights(graph), record_file)
    if write:
        save_caffe(graph.fused, outs[0], outs[1])
    start_calibration(graph, ifmr_mode=ifmr_mode, then=lambda records: write_records(records, record_file),
                      summaries=False)  # these calls write no visual report
    log.info("run the returned model on %d batch(es) of calibration data", graph.config.batch_num)
    return graph.fused


def _read_records(graph: QuantGraph) -> dict:
    """The record file of ``graph``, read and checked (every quantized layer's and joint
    Eltwise's factors present, every entry valid)."""
    if graph.record_file is None:
        raise RecordError("this graph has no record file: save_model takes the graph returned "
                          "by init() or quantize()")
    return check_records(graph, read_record(graph.record_file), graph.record_file)


@checked(graph=instance(QuantGraph, what="the graph returned by init()"), save_type=one_of(*SAVE_TYPES),
         save_path=path_arg)
def save_model(graph: QuantGraph, save_type: str, save_path: str) -> list[str]:
    """Write the quantized models: ``save_type`` ``Fakequant``, ``Deploy`` or ``Both`` →
    ``{save_path}_fake_quant_model.prototxt`` / ``_fake_quant_weights.caffemodel``,
    ``{save_path}_deploy_model.prototxt`` / ``_deploy_weights.caffemodel`` and
    ``{save_path}_quant.json``, from the graph's record file. Error (nothing written) if a
    quantized layer lacks factors. Returns the paths written. The files are committed together
    (``amct_torch.files.transaction``): an error or a kill leaves the previous files as they were."""
    from amct_torch.export import write_caffe_models

    save_path = _output_path(save_path, "save_path")
    if graph.fused is None or graph.session is None:
        raise CalibrationError("save_model needs a calibrated graph: call quantize_model and run "
                               "its model on the calibration batches first")
    inputs = [graph.model_file, graph.weights_file, graph.config_file, graph.record_file]
    with OutputTransaction(model_paths(save_path, save_type), [p for p in inputs if p is not None],
                           name=os.path.basename(save_path), known_suffixes=prefix_suffixes()) as tx:
        records = _read_records(graph)
        staged = write_caffe_models(graph, records, save_type, tx.staged_prefix(save_path),
                                    record_file=graph.record_file)
        return tx.commit([tx.final_of(p) for p in staged.values()])


@checked(model_file=path_arg, weights_file=path_arg, scale_offset_record_file=path_arg, save_path=path_arg)
def convert_model(model_file: str, weights_file: str, scale_offset_record_file: str,
                  save_path: str, *, allow_unknown_fields: bool = False) -> list[str]:
    """Build the fake-quant and deploy models from a record the user supplies (no
    calibration); honours each record's ``skip_fusion``. A prototxt field the tool does not
    read is refused unless ``allow_unknown_fields``."""
    from amct_torch.export import convert_model as convert
    model_file = _need_file(model_file, "model file")
    weights_file = _need_file(weights_file, "weights file")
    record_file = _need_file(scale_offset_record_file, "record file", RecordError)
    save_path = _output_path(save_path, "save_path")
    with OutputTransaction(model_paths(save_path, "Both"), [model_file, weights_file, record_file],
                           name=os.path.basename(save_path), known_suffixes=prefix_suffixes()) as tx:
        with unknown_fields_within(allow_unknown_fields):
            staged = convert(model_file, weights_file, record_file, tx.staged_prefix(save_path))
        return tx.commit([tx.final_of(p) for p in staged])
