"""The Caffe output models: the fake-quant net, the deploy net (int8 weights, int32 bias) and
the graph → NetParameter builder with AMCT's Quant/DeQuant layers. See docs/export.md.

The file names (AMCT's) are declared here, without imports, where the writers and the exporter
(``exporter.py``) both read them."""
from __future__ import annotations

#: ``save_model``'s save_type values (AMCT's): which Caffe models are written
SAVE_TYPES = ("Fakequant", "Deploy", "Both")
#: kind -> the suffix of each file the Caffe exporter writes under an output prefix
SUFFIXES = {
    "fake_quant_model": "_fake_quant_model.prototxt",
    "fake_quant_weights": "_fake_quant_weights.caffemodel",
    "deploy_model": "_deploy_model.prototxt",
    "deploy_weights": "_deploy_weights.caffemodel",
    "quant": "_quant.json",
}


def model_kinds(save_type: str) -> list[str]:
    """The kinds ``save_model`` writes for ``save_type`` (Fakequant, Deploy or Both): the
    fake-quant and/or deploy Caffe models and the quant info JSON."""
    out = []
    if save_type in ("Fakequant", "Both"):
        out += ["fake_quant_model", "fake_quant_weights"]
    if save_type in ("Deploy", "Both"):
        out += ["deploy_model", "deploy_weights"]
    return out + ["quant"]


def model_paths(save_path: str, save_type: str) -> list[str]:
    """The files ``save_model`` writes for ``save_type`` (``model_kinds``) under ``save_path``."""
    return [save_path + SUFFIXES[k] for k in model_kinds(save_type)]
