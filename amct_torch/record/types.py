"""One layer's entry of the scale/offset record (``SingleLayerRecord`` in
``proto/scale_offset_record.proto``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class LayerRecord:
    """Quantization factors of one layer.

    ``scale_d``/``offset_d``: activation (data) factors; ``scale_w``/``offset_w``: weight
    factors (one entry per tensor or per output channel; absent for AVE Pooling);
    ``shift_bit``: kept only to refuse non-zero values; ``channels``/``height``/``width``: the
    layer's input shape; ``skip_fusion``: BN fusion was skipped for this layer. Floats are the
    float32 values of the file, held as Python floats.
    """

    scale_d: Optional[float] = None
    offset_d: Optional[int] = None
    scale_w: list[float] = field(default_factory=list)
    offset_w: list[int] = field(default_factory=list)
    shift_bit: list[int] = field(default_factory=list)
    channels: Optional[int] = None
    height: Optional[int] = None
    width: Optional[int] = None
    skip_fusion: bool = False
