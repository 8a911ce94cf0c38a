"""``convert_model`` and ``save_quant_models``: a record → the output model files.

convert_model is AMCT's way to build the fake-quant and deploy models from a record
a user already has, without calibration: load the float model, validate the record against it
(every rule of validate_record), fuse BN as quantize_model would (honouring each record's
``skip_fusion``), then write both models and the quant info JSON.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Optional

import torch

from amct_torch.caffe.duplicate_names import refuse_quantized_duplicates
from amct_torch.caffe.graph import build_graph
from amct_torch.caffe.netio import parse_caffemodel, parse_prototxt, read_net
from amct_torch.config import layer_infos_from_net
from amct_torch.errors import ExportError, ModelError
from amct_torch.export.caffe import SAVE_TYPES, SUFFIXES, model_paths
from amct_torch.export.caffe.deploy import save_deploy
from amct_torch.export.caffe.fakequant import save_fake_quant
from amct_torch.export.quant_info import fused_layers_of, write_quant_info
from amct_torch.record import LayerRecord, read_record, validate_record

_QUANT_TYPES = ("Quant", "DeQuant", "AscendQuant", "AscendDequant")
_QUANT_TYPE_TEXT = re.compile(r'\btype\s*:\s*"(' + "|".join(_QUANT_TYPES) + r')"')
_NAME_TEXT = re.compile(r'\bname\s*:\s*"([^"]*)"')


def refuse_quantized_model(model_file: str, weights_file: Optional[str]) -> None:
    """A model that already has Quant/DeQuant layers or int8/int32/uint64 blob data is an
    output of quantization, not an input: ModelError naming the file and layer."""
    try:
        with open(model_file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    m = _QUANT_TYPE_TEXT.search(text)
    if m is not None:  # also catches our uint8-offset form, which the schema cannot parse
        names = _NAME_TEXT.findall(text[:m.start()])
        raise ModelError(f"the model already contains a {m.group(1)} layer (it is a quantized "
                         "model); convert_model needs the original float model",
                         file=model_file, layer=names[-1] if names else None)
    net = parse_prototxt(model_file)
    for layer in list(net.layer):
        if layer.type in _QUANT_TYPES:
            raise ModelError(f"the model already contains a {layer.type} layer (it is a quantized "
                             "model); convert_model needs the original float model",
                             file=model_file, layer=layer.name)
    if weights_file is None:
        return
    weights = parse_caffemodel(weights_file)
    for layer in list(weights.layer) + list(weights.layers):
        for blob in layer.blobs:
            if len(blob.int8_data) or len(blob.int32_data) or len(blob.uint64_data):
                raise ModelError("the caffemodel holds int8/int32/uint64 blob data (a deploy "
                                 "model); convert_model needs the original float weights",
                                 file=weights_file, layer=layer.name)


def save_quant_models(fused: torch.fx.GraphModule, records: Mapping[str, LayerRecord], *,
                      save_type: str = "Both", save_path: str,
                      fused_layers: Optional[Mapping[str, Sequence[str]]] = None,
                      record_file: Optional[str] = None, offset_form: str = "uint8") -> list[str]:
    """Write the models of ``save_type`` (``Fakequant``/``Deploy``/``Both``) and
    ``{save_path}_quant.json`` for a fused graph and its (validated) record; returns the paths.
    Everything is computed before the first file is written, so an export error (e.g. an int32
    bias overflow) leaves no partial output."""
    if save_type not in SAVE_TYPES:
        raise ExportError(f"save_type must be one of {', '.join(SAVE_TYPES)}, got {save_type!r}")
    from amct_torch.export.layer_quant import plan_layers
    # every check (the int32 bias overflow included) before anything is written; the weights
    # are quantized layer by layer as each model is written
    plan_layers(fused, records, record_file, weights=False)
    fused_map = dict(fused_layers) if fused_layers is not None else fused_layers_of(fused)
    emitted = None
    if save_type in ("Fakequant", "Both"):
        emitted = save_fake_quant(fused, records, save_path, offset_form, record_file)
    if save_type in ("Deploy", "Both"):
        emitted = save_deploy(fused, records, save_path, offset_form, record_file)
    assert emitted is not None, save_type  # save_type was checked against SAVE_TYPES
    write_quant_info(save_path + SUFFIXES["quant"], emitted, fused_map)
    return model_paths(save_path, save_type)


def convert_model(model_file: str, weights_file: str, scale_offset_record_file: str,
                  save_path: str) -> list[str]:
    """Build ``{save_path}_fake_quant_model.prototxt``/``_fake_quant_weights.caffemodel``,
    ``_deploy_model.prototxt``/``_deploy_weights.caffemodel`` and ``_quant.json`` from a
    user's record. Returns the paths written."""
    from amct_torch.fusion import fuse_bn
    model_file, weights_file = os.fspath(model_file), os.fspath(weights_file)
    record_file, save_path = os.fspath(scale_offset_record_file), os.fspath(save_path)
    refuse_quantized_model(model_file, weights_file)
    parsed = read_net(model_file, weights_file)
    records = read_record(record_file)
    refuse_quantized_duplicates(parsed.net.layer, records, model_file)
    validate_record(records, layer_infos_from_net(parsed.net), record_file)
    gm = build_graph(parsed)
    result = fuse_bn(gm, do_fusion=True,
                     record_skip_fusion=[k for k, r in records.items() if r.skip_fusion],
                     file=model_file)
    return save_quant_models(result.graph, records, save_type="Both", save_path=save_path,
                             fused_layers=result.fused, record_file=record_file)
