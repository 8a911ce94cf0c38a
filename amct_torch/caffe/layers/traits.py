"""What the config, quantization, fusion, export and report code ask of a Caffe layer type.

Each trait is a class attribute of the type's ``CaffeLayer`` class (declared once there, listed
in ``base.py``; the quantization traits come from the torch-free ``caffe/quant_types.py``, which
the config code reads without torch); these functions answer for a type string, a layer class
or a layer module, so that no other code keeps its own list of type names (docs/extending.md,
"Adding a layer type").
An unknown type string has no traits (every answer False / None).
"""
from __future__ import annotations

from typing import Any, Optional, Union

from amct_torch.caffe import quant_types
from amct_torch.caffe.layers.base import CaffeLayer, layer_class

TypeOrModule = Union[str, CaffeLayer, type[CaffeLayer], Any]


def layer_type(x: TypeOrModule) -> Optional[type[CaffeLayer]]:
    """The layer class of a type string, a class or a module (by its ``caffe_type`` when it is
    not a CaffeLayer), or None for a type nobody registered."""
    if isinstance(x, str):
        return layer_class(x)
    if isinstance(x, type):
        return x if issubclass(x, CaffeLayer) else None
    if isinstance(x, CaffeLayer):
        return type(x)
    name = getattr(x, "caffe_type", None)
    return layer_class(name) if isinstance(name, str) else None


def _trait(x: TypeOrModule, name: str, default: Any = False) -> Any:
    """The class attribute ``name`` of the type's layer class, or ``default`` for an unknown type."""
    cls = layer_type(x)
    return default if cls is None else getattr(cls, name)


def is_quantizable_type(x: TypeOrModule) -> bool:
    """AMCT quantizes the type (a layer's params may still rule it out: ``quantizable_param``)."""
    return bool(_trait(x, "quantizable_type"))


def is_net_head(x: TypeOrModule) -> bool:
    """A metric or loss layer: run after the inference graph (caffe/head.py), never quantized."""
    return bool(_trait(x, "net_head"))


def quantizable_param(x: TypeOrModule, layer_param: Any) -> bool:
    """Whether a layer of this type with these params is quantized."""
    cls = layer_type(x)
    return cls is not None and cls.quantizable_param(layer_param)


def weight_layout(x: TypeOrModule) -> Optional[str]:
    """"conv", "deconv", "fc" (the quantized weight's torch layout) or None (no quantized weight)."""
    return _trait(x, "weight_layout", None)


def is_weighted(x: TypeOrModule) -> bool:
    """The type has a quantized weight (scale_w / offset_w in the record)."""
    return weight_layout(x) is not None


def is_fully_connected(x: TypeOrModule) -> bool:
    """The weight is (N, K): one row per output, quantized per tensor only."""
    return weight_layout(x) == "fc"


def is_channel_wise(x: TypeOrModule) -> bool:
    """The weight may be quantized per output channel (the convolutions)."""
    return weight_layout(x) in ("conv", "deconv")


def is_transposed(x: TypeOrModule) -> bool:
    """The weight is (C_in, C_out/g, kh, kw): output channels along axis 1 with its groups."""
    return weight_layout(x) == "deconv"


def weight_param(x: TypeOrModule) -> Optional[str]:
    """The LayerParameter field with ``num_output`` and ``bias_term`` of a weighted type."""
    return _trait(x, "weight_param", None)


def is_depthwise(x: TypeOrModule) -> bool:
    """A fork's depthwise convolution."""
    return bool(_trait(x, "depthwise"))


def is_per_sample(x: TypeOrModule) -> bool:
    """Computes every sample of a batch on its own (given an axis > 0, no batch statistics)."""
    return bool(_trait(x, "per_sample"))


def folds_bn_after(x: TypeOrModule) -> bool:
    """A BatchNorm + Scale after a layer of this type folds into its weights."""
    return bool(_trait(x, "fold_bn_after"))


def folds_scale_before(x: TypeOrModule) -> bool:
    """A Scale before a layer of this type folds into its weights."""
    return bool(_trait(x, "fold_scale_before"))


def fillers(x: TypeOrModule) -> Optional[tuple[str, tuple[tuple[str, Optional[float]], ...]]]:
    """Caffe's fillers of the type's blobs (``CaffeLayer.fillers``), or None."""
    return _trait(x, "fillers", None)


def quantizable_types() -> tuple[str, ...]:
    """The type strings AMCT quantizes (``caffe/quant_types.py``): BVLC's, then the forks' depthwise ones."""
    return quant_types.quantizable_types()
