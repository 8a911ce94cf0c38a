"""The resolved quantization config: global settings plus one ``LayerQuantConfig`` per
quantizable layer. Both the quant.cfg reader and the JSON reader produce this form, and the
JSON writer writes it, so the two paths can be compared field by field."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Defaults of AMCT's quant.cfg (docs/config_and_record.md, "quant.cfg resolution").
IFMR_DEFAULTS = {"search_range_start": 0.7, "search_range_end": 1.3, "search_step": 0.01,
                 "max_percentile": 0.999999, "min_percentile": 0.999999}
HFMG_DEFAULT_BINS = 4096
HFMG_BINS = (1024, 2048, 4096, 8192)
NUM_BITS = 8
WTS_ALGO = "arq_quantize"
ACT_ALGOS = ("ifmr", "hfmg")
JSON_VERSION = 1


@dataclass(frozen=True)
class LayerQuantConfig:
    """How one layer is quantized.

    IFMR layers carry ``max_percentile``, ``min_percentile``, ``search_range`` (start, end) and
    ``search_step``; HFMG layers carry ``num_of_bins``; the fields of the other algorithm are
    ``None``. Floats read from quant.cfg (float32 there) are turned into the shortest decimal
    that denotes the same float32 (``0.999999``, not ``0.9999989867``), as AMCT does, so a
    config read from quant.cfg, written to JSON and read back compares equal.
    """

    quant_enable: bool = True
    act_algo: str = "ifmr"
    max_percentile: Optional[float] = 0.999999
    min_percentile: Optional[float] = 0.999999
    search_range: Optional[tuple[float, float]] = (0.7, 1.3)
    search_step: Optional[float] = 0.01
    num_of_bins: Optional[int] = None
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
