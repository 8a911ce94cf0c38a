"""The deploy Caffe model (docs/export.md): what an int8 runtime (Ascend) executes.

Quant layers as in the fake-quant model (AscendQuant: y = clamp(round(x·(1/scale_d)) +
offset_d)); quantized layers hold int8 weights (``BlobProto.int8_data``, field 100, one byte
per element) and an int32 bias (``int32_data``, field 101) = round(b/(scale_d·scale_w_c));
each DeQuant layer holds one uint64 per output channel (``uint64_data``, field 102): bits 0–31
the float32 bits of deq_scale = scale_d·scale_w_c, bits 32–39 shift_bit (always 0), bits 40–47
offset_w (always 0). Other layers keep their float blobs.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np
import torch

from amct_torch.caffe.layers import CaffeLayer
from amct_torch.export.caffe import SUFFIXES
from amct_torch.export.caffe.netbuild import EmittedNet, emit_net
from amct_torch.export.caffe.text import write_caffe_layers
from amct_torch.export.layer_quant import LayerQuant, LazyPlan, plan_layers
from amct_torch.record import LayerRecord


def pack_deq_scale(deq_scale: np.ndarray, shift_bit: int = 0, offset_w: int = 0) -> np.ndarray:
    """One uint64 per channel: float32 bits of deq_scale | shift_bit << 32 | offset_w << 40."""
    bits = np.asarray(deq_scale, np.float32).view(np.uint32).astype(np.uint64)
    return bits | (np.uint64(shift_bit & 0xFF) << np.uint64(32)) | (np.uint64(offset_w & 0xFF) << np.uint64(40))


def unpack_deq_scale(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(deq_scale float32, shift_bit, offset_w int8) from the packed uint64 values."""
    p = np.asarray(packed, np.uint64)
    deq = (p & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    shift = ((p >> np.uint64(32)) & np.uint64(0xFF)).astype(np.int64)
    off = ((p >> np.uint64(40)) & np.uint64(0xFF)).astype(np.uint8).view(np.int8)
    return deq, shift, off


def _deploy_blobs(lq: Optional[LayerQuant], mod: CaffeLayer) -> list[np.ndarray]:
    blobs = [np.asarray(b, np.float32) for b in mod.caffe_blobs()]
    if lq is None or not lq.weighted:
        return blobs
    assert lq.int8_weight is not None  # a weighted layer's plan has its weights
    out = [lq.int8_weight.reshape(blobs[0].shape)]
    if lq.bias_int32 is not None:
        out.append(lq.bias_int32)
    return out


def _deploy_dequant_blobs(lq: LayerQuant) -> list[np.ndarray]:
    assert lq.deq_scale is not None  # only quantized layers get a DeQuant
    return [pack_deq_scale(lq.deq_scale)]


def deploy_net(gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord],
               file: Optional[str] = None) -> EmittedNet:
    """The deploy NetParameter (with blobs) of a (fused) graph and its record."""
    plan = plan_layers(gm, records, file)
    return emit_net(gm, plan, _deploy_blobs, _deploy_dequant_blobs, file)


def save_deploy(gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord], save_path: str,
                offset_form: str = "uint8", file: Optional[str] = None) -> EmittedNet:
    """Write ``{save_path}_deploy_model.prototxt`` and ``{save_path}_deploy_weights.caffemodel``."""
    plan = LazyPlan(gm, records, file, fake=False, rows=True)  # every check now; each layer's int8 as written
    emitted = emit_net(gm, plan.light, _deploy_blobs, _deploy_dequant_blobs, file, full=plan)
    write_caffe_layers(emitted, save_path + SUFFIXES["deploy_model"],
                       save_path + SUFFIXES["deploy_weights"], offset_form)
    return emitted
