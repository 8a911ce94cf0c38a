"""The resolved quantization config: global settings plus one ``LayerQuantConfig`` per
quantizable layer. Both the quant.cfg reader and the JSON reader produce this form, and the
JSON writer writes it, so the two paths can be compared field by field."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from amct_torch.config.act_algos import DEFAULT

NUM_BITS = 8
WTS_ALGO = "arq_quantize"
JSON_VERSION = 1
_D = DEFAULT.defaults()


@dataclass(frozen=True)
class LayerQuantConfig:
    """How one layer is quantized.

    Each activation algorithm's fields (``config/act_algos.py``: IFMR ``max_percentile``,
    ``min_percentile``, ``search_range`` (start, end), ``search_step``; HFMG ``num_of_bins``)
    are set for the layer's ``act_algo`` and ``None`` for the others (the default: IFMR's).
    Floats read from quant.cfg (float32 there) are turned into the shortest decimal that
    denotes the same float32 (``0.999999``, not ``0.9999989867``), as AMCT does, so a
    config read from quant.cfg, written to JSON and read back compares equal.
    """

    quant_enable: bool = True
    act_algo: str = DEFAULT.name
    max_percentile: Optional[float] = _D["max_percentile"]
    min_percentile: Optional[float] = _D["min_percentile"]
    search_range: Optional[tuple[float, float]] = _D["search_range"]
    search_step: Optional[float] = _D["search_step"]
    num_of_bins: Optional[int] = _D.get("num_of_bins")
    asymmetric: bool = True
    wts_algo: str = WTS_ALGO
    channel_wise: bool = True
    num_bits: int = NUM_BITS


@dataclass
class QuantConfig:
    """Global settings and the per-layer configs (``layers`` ordered by layer name)."""

    batch_num: int = 1
    activation_offset: bool = True
    joint_quant: bool = False
    do_fusion: bool = True
    skip_fusion_layers: list[str] = field(default_factory=list)
    layers: dict[str, LayerQuantConfig] = field(default_factory=dict)
    version: int = JSON_VERSION

    def enabled_layers(self) -> list[str]:
        """Names of the layers that will be quantized."""
        return [n for n, c in self.layers.items() if c.quant_enable]
