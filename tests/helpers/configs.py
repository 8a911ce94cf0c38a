"""Shared model layer list and helpers for the config/record tests (no loader needed)."""
from __future__ import annotations

import os

from amct_torch.config.layers import LayerInfo

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")

#: A small model: every quantizable type, plus layers that are not quantizable.
LAYERS = [
    LayerInfo("conv1", "Convolution", True, True, 8),
    LayerInfo("relu1", "ReLU", False, False),
    LayerInfo("pool1", "Pooling", True, False),          # AVE, not global
    LayerInfo("pool2", "Pooling", False, False),         # MAX
    LayerInfo("conv2", "Convolution", True, True, 16),
    LayerInfo("deconv1", "Deconvolution", True, True, 4),
    LayerInfo("fc1", "InnerProduct", True, True, 10),
    LayerInfo("prob", "Softmax", False, False),
]


def write(tmp_path, name: str, text: str) -> str:
    """Write ``text`` to ``tmp_path/name`` and return the path as a string."""
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def use_hfmg(path: str, num_of_bins: int = 4096, asymmetric: bool = True) -> None:
    """Rewrite the JSON quant config at ``path`` so that every layer calibrates with HFMG."""
    import json
    with open(path) as f:
        cfg = json.load(f)
    for v in cfg.values():
        if isinstance(v, dict) and "activation_quant_params" in v:
            v["activation_quant_params"] = {"num_bits": 8, "act_algo": "hfmg", "num_of_bins": num_of_bins,
                                            "asymmetric": asymmetric}
    with open(path, "w") as f:
        json.dump(cfg, f)
