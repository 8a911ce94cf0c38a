"""Caffe layer types as torch modules (one module per Caffe layer), and their registry."""
# imported for their registrations: BVLC's types, the segmentation/detection forks' and the
# mobile/YOLO/SegNet forks'
from amct_torch.caffe.layers import (  # noqa: F401
    activations,
    conv,
    interp,
    mobile,
    norm,
    pooling,
    quant,
    rcnn,
    segnet,
    ssd,
    structure,
    upsample,
    yolo,
)
from amct_torch.caffe.layers.base import CaffeLayer, layer_class, register, supported_types
from amct_torch.caffe.layers.conv import ConvolutionLayer, DeconvolutionLayer, InnerProductLayer
from amct_torch.caffe.layers.norm import BatchNormLayer, BiasLayer, LRNLayer, NormalizeLayer, ScaleLayer
from amct_torch.caffe.layers.pooling import PoolingLayer, caffe_pool2d, caffe_pooled_size
from amct_torch.caffe.layers.quant import DeQuantLayer, QuantLayer

QUANTIZABLE_TYPES = ("Convolution", "Deconvolution", "InnerProduct", "Pooling") + mobile.DEPTHWISE_TYPES


def is_quantizable(module: CaffeLayer) -> bool:
    """True for the layers AMCT quantizes: Convolution, Deconvolution, InnerProduct, and
    Pooling AVE that is not global (the type-level constraints such as IP axis are config's)."""
    if isinstance(module, PoolingLayer):
        return module.quantizable
    return module.caffe_type in QUANTIZABLE_TYPES


__all__ = ["CaffeLayer", "register", "layer_class", "supported_types", "ConvolutionLayer",
           "DeconvolutionLayer", "InnerProductLayer", "BatchNormLayer", "ScaleLayer", "BiasLayer",
           "LRNLayer", "NormalizeLayer", "PoolingLayer", "QuantLayer", "DeQuantLayer", "caffe_pool2d",
           "caffe_pooled_size", "is_quantizable", "QUANTIZABLE_TYPES"]
