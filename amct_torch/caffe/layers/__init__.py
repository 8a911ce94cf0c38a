"""Caffe layer types as torch modules (one module per Caffe layer), and their registry."""
# imported for their registrations: BVLC's types, the segmentation/detection forks' and the
# mobile/YOLO/SegNet forks'
from amct_torch.caffe.layers import (  # noqa: F401
    activations,
    conv,
    interp,
    metrics,
    mobile,
    norm,
    pooling,
    quant,
    rcnn,
    segnet,
    ssd,
    ssd_eval,
    structure,
    upsample,
    yolo,
)
from amct_torch.caffe.layers.base import CaffeLayer, layer_class, register, supported_types
from amct_torch.caffe.layers.conv import ConvolutionLayer, DeconvolutionLayer, InnerProductLayer
from amct_torch.caffe.layers.norm import BatchNormLayer, BiasLayer, LRNLayer, NormalizeLayer, ScaleLayer
from amct_torch.caffe.layers.pooling import PoolingLayer, caffe_pool2d, caffe_pooled_size
from amct_torch.caffe.layers.quant import DeQuantLayer, QuantLayer
from amct_torch.caffe.layers.traits import is_quantizable_type


def is_quantizable(module: CaffeLayer) -> bool:
    """True for the layers AMCT quantizes: the types with ``quantizable_type``, Pooling only when
    AVE and not global (the other per-layer constraints, such as IP axis, are config's)."""
    if isinstance(module, PoolingLayer):
        return module.quantizable
    return is_quantizable_type(module)


__all__ = ["CaffeLayer", "register", "layer_class", "supported_types", "ConvolutionLayer",
           "DeconvolutionLayer", "InnerProductLayer", "BatchNormLayer", "ScaleLayer", "BiasLayer",
           "LRNLayer", "NormalizeLayer", "PoolingLayer", "QuantLayer", "DeQuantLayer", "caffe_pool2d",
           "caffe_pooled_size", "is_quantizable"]
