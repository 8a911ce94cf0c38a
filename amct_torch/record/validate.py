"""Checks of a record against the model (the rules of docs/config_and_record.md, "Record"),
run once when a record is consumed (convert_model, save_model, the one-call job before it
writes). Each failure raises ``RecordError`` naming the layer and file and saying what to
change."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NoReturn, Optional

from amct_torch.algorithms.quant import FLT_EPS, QMAX, QMIN
from amct_torch.caffe.layers.traits import is_depthwise, is_fully_connected
from amct_torch.config.layers import LayerInfo
from amct_torch.errors import RecordError
from amct_torch.record.types import LayerRecord


def _finite_positive(v: float) -> bool:
    return math.isfinite(v) and v > 0.0


#: plausible scales (docs/config_and_record.md): calibration never writes a scale below
#: FLT_EPS (a smaller one becomes 1.0), and above SCALE_MAX the dequant scale
#: scale_d·scale_w and 255·scale could leave float32; outside [SCALE_MIN, SCALE_MAX] the
#: quantized input or weight degenerates (3e38 makes every input the constant offset_d)
SCALE_MIN = FLT_EPS
SCALE_MAX = 1e18


def _plausible(name: str, v: float) -> str | None:
    if not SCALE_MIN <= v <= SCALE_MAX:
        return (f"{name} {v!r} is outside the plausible range [{SCALE_MIN:g}, {SCALE_MAX:g}] "
                "(the quantized values would degenerate in float32); recalibrate this layer")
    return None


def validate_layer_record(name: str, r: LayerRecord, info: LayerInfo, path: Optional[str]) -> None:
    """Every rule for one entry whose layer exists in the model."""
    def fail(text: str) -> NoReturn:
        raise RecordError(text, file=path, layer=name)

    joint = info.type == "Eltwise"  # joint_quant: one shared input factor
    if not info.quantizable and not joint:
        fail(f"layer type {info.type} is not quantizable here (quantizable: Convolution, "
             "Deconvolution, InnerProduct, AVE non-global Pooling, and Eltwise with "
             "joint_quant); remove its record entry")
    if r.scale_d is None or r.offset_d is None:
        missing = " and ".join(k for k in ("scale_d", "offset_d") if getattr(r, k) is None)
        fail(f"{missing} missing: every record entry needs activation factors")
    if not _finite_positive(r.scale_d):
        fail(f"scale_d must be finite and > 0, got {r.scale_d!r}")
    why = _plausible("scale_d", r.scale_d)
    if why:
        fail(why)
    if not QMIN <= r.offset_d <= QMAX:
        fail(f"offset_d must be in [{QMIN}, {QMAX}], got {r.offset_d}")
    if any(s != 0 for s in r.shift_bit):
        fail(f"shift_bit {r.shift_bit} is not supported (non-zero shift): edit the record entry "
             f"of layer '{name}' to remove its shift_bit lines or set them to 0")
    if info.weighted:
        if not r.scale_w or not r.offset_w:
            fail("scale_w and offset_w are required for a layer with weights "
                 f"({info.type}); got {len(r.scale_w)} scale_w and {len(r.offset_w)} offset_w")
        if len(r.scale_w) != len(r.offset_w):
            fail(f"scale_w has {len(r.scale_w)} values but offset_w has {len(r.offset_w)}: "
                 "they must have the same length")
        allowed = {1} if info.out_channels is None else {1, info.out_channels}
        # a ConvolutionDepthwise may omit num_output (its fork makes one output channel per
        # input channel): the prototxt alone cannot size it, and the exporters check the count
        # against the loaded weights
        sized_by_weights = info.out_channels is None and is_depthwise(info.type)
        if len(r.scale_w) not in allowed and not sized_by_weights:
            per_channel = ("its output channel count is unknown" if info.out_channels is None
                           else f"{info.out_channels} (one per output channel)")
            fail(f"scale_w has {len(r.scale_w)} values; expected 1 (per tensor) or "
                 f"{per_channel}")
        if is_fully_connected(info.type) and len(r.scale_w) != 1:
            fail(f"InnerProduct weights are quantized per tensor: expected 1 scale_w, got "
                 f"{len(r.scale_w)}")
    elif joint and (r.scale_w or r.offset_w):
        fail("an Eltwise (joint_quant) entry holds only scale_d/offset_d: remove its "
             "scale_w/offset_w lines")
    elif (r.scale_w or r.offset_w) and not (r.scale_w == [1.0] and r.offset_w == [0]):
        # AVE Pooling has no weights; only the neutral factors (1.0, 0) are tolerated.
        fail(f"{info.type} has no weights: scale_w/offset_w must be absent (got scale_w "
             f"{r.scale_w}, offset_w {r.offset_w})")
    bad = [s for s in r.scale_w if not _finite_positive(s)]
    if bad:
        fail(f"scale_w must be finite and > 0, got {bad[0]!r}")
    for s in r.scale_w:
        why = _plausible("scale_w", s)
        if why:
            fail(why)
    if any(o != 0 for o in r.offset_w):
        fail(f"offset_w must be all 0 (weights are quantized symmetrically), got {r.offset_w}")


def validate_record(records: Mapping[str, LayerRecord], layers: Sequence[LayerInfo],
                    path: Optional[str]) -> None:
    """Refuse an empty record, keys that are not quantizable layers of the model, and every
    entry that breaks a rule (``validate_layer_record``). ``path``: the file the record was
    read from, named in the errors (None for a record computed in memory, whose caller names
    the files its values came from)."""
    if not records:
        raise RecordError("the record is empty: no layer has quantization factors", file=path)
    by_name = {l.name: l for l in layers}
    for name, r in records.items():
        info = by_name.get(name)
        if info is None:
            raise RecordError("layer not found in the model: remove this record entry or fix "
                              "its key", file=path, layer=name)
        validate_layer_record(name, r, info, path)
