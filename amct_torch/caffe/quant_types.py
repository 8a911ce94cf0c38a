"""The Caffe layer types AMCT quantizes and how: the quantized weight's layout, the parameter
field holding ``num_output``, and which params rule a layer of the type out.

Declared here once and torch-free: the config code (``config/layers.py``, the ``config``
command) reads it without building a layer, and the layer classes take these traits from it
when they register (``caffe/layers/base.py``), where the rest of the package asks them
(``caffe/layers/traits.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

#: PoolingParameter.pool of average pooling (caffe.proto)
POOL_AVE = 1


@dataclass(frozen=True)
class QuantType:
    """How AMCT quantizes a layer type: ``weight_layout`` "conv" (C_out, C_in/g, kh, kw),
    "deconv" (C_in, C_out/g, kh, kw), "fc" (N, K) or None (no quantized weight: no scale_w in
    the record); ``weight_param`` the LayerParameter field with ``num_output`` and
    ``bias_term``; ``takes`` whether a layer with these params (a ``LayerParameter`` or V1
    layer) is quantized."""

    weight_layout: Optional[str]
    weight_param: Optional[str]
    takes: Callable[[Any], bool]


def _conv_2d(layer: Any) -> bool:
    p = layer.convolution_param
    return len(p.kernel_size) <= 2 and len(p.stride) <= 2 and len(p.pad) <= 2 and \
        len(p.dilation) <= 2 and p.axis == 1


def _deconv(layer: Any) -> bool:
    return _conv_2d(layer) and all(d == 1 for d in layer.convolution_param.dilation)


def _fully_connected(layer: Any) -> bool:
    p = layer.inner_product_param
    return (not p.transpose) and p.axis == 1


def _average_pooling(layer: Any) -> bool:
    p = layer.pooling_param
    return p.pool == POOL_AVE and not p.global_pooling


_CONV = QuantType("conv", "convolution_param", _conv_2d)

#: type string -> how it is quantized; a type not listed is never quantized
QUANT_TYPES: dict[str, QuantType] = {
    "Convolution": _CONV,
    "Deconvolution": QuantType("deconv", "convolution_param", _deconv),
    "InnerProduct": QuantType("fc", "inner_product_param", _fully_connected),
    "Pooling": QuantType(None, None, _average_pooling),
    "DepthwiseConvolution": _CONV,  # the forks' depthwise convolutions, quantized as Convolution
    "ConvolutionDepthwise": _CONV,
}


def quantizable_types() -> tuple[str, ...]:
    """The type strings AMCT quantizes: BVLC's, then the forks' depthwise ones."""
    return tuple(QUANT_TYPES)


def is_channel_wise(type_name: str) -> bool:
    """The type's weight may be quantized per output channel (the convolutions)."""
    quant = QUANT_TYPES.get(type_name)
    return quant is not None and quant.weight_layout in ("conv", "deconv")
