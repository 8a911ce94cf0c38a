"""Merging factors into a record held in memory (``{layer: LayerRecord}``).

Why pure functions over a dict: AMCT's API writes the record file after the weight factors and
again once the activation factors are computed, while the one-call job keeps the record in
memory and writes it once; both must merge the same way so that they write the same bytes.
Existing entries keep their place and their other factors, new layers are appended, and the
input dict is left as it was.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from amct_torch.record.types import LayerRecord

#: activation factors of one record key: (scale_d, offset_d, channels, height, width); the
#: shape is None for a joint Eltwise entry
ActivationFactors = tuple[float, int, Optional[int], Optional[int], Optional[int]]


def _copy(records: Mapping[str, LayerRecord]) -> dict[str, LayerRecord]:
    return {k: dataclasses.replace(r, scale_w=list(r.scale_w), offset_w=list(r.offset_w),
                                   shift_bit=list(r.shift_bit)) for k, r in records.items()}


def add_weight_factors(records: Mapping[str, LayerRecord],
                       factors: Mapping[str, tuple[Sequence[float], Sequence[int]]],
                       skip_fusion: Iterable[str] = ()) -> dict[str, LayerRecord]:
    """``records`` with the weight factors ``{layer: (scale_w, offset_w)}`` replacing those
    layers' previous ones; layers in ``skip_fusion`` get ``skip_fusion: true``."""
    out = _copy(records)
    for name, (scale_w, offset_w) in factors.items():
        r = out.setdefault(name, LayerRecord())
        r.scale_w = [float(s) for s in scale_w]
        r.offset_w = [int(o) for o in offset_w]
    for name in skip_fusion:
        out.setdefault(name, LayerRecord()).skip_fusion = True
    return out


def add_activation_factors(records: Mapping[str, LayerRecord],
                           factors: Mapping[str, ActivationFactors]) -> dict[str, LayerRecord]:
    """``records`` with the activation factors ``{layer: (scale_d, offset_d, c, h, w)}``
    merged in: entries keep their weight factors and order, new layers are appended."""
    out = _copy(records)
    for name, (scale_d, offset_d, c, h, w) in factors.items():
        r = out.setdefault(name, LayerRecord())
        r.scale_d, r.offset_d = float(scale_d), offset_d
        r.channels, r.height, r.width = c, h, w
    return out
