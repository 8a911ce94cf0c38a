"""The layer traits the rest of the package asks (``caffe.layers.traits``), checked against the
layer types the docs name for each (docs/config_and_record.md, docs/design.md)."""
from __future__ import annotations

import pytest

from amct_torch.caffe.layers import supported_types, traits
from amct_torch.caffe.layers.conv import ConvolutionLayer
from amct_torch.proto import amct_caffe_pb2 as pb


def _having(trait) -> set:
    return {t for t in supported_types() if trait(t)}


def test_the_quantized_and_weighted_types():
    forks = {"DepthwiseConvolution", "ConvolutionDepthwise"}
    assert _having(traits.is_quantizable_type) == {"Convolution", "Deconvolution", "InnerProduct", "Pooling"} | forks
    assert _having(traits.is_weighted) == {"Convolution", "Deconvolution", "InnerProduct"} | forks
    assert _having(traits.is_channel_wise) == {"Convolution", "Deconvolution"} | forks
    assert _having(traits.is_depthwise) == forks
    assert _having(traits.is_transposed) == {"Deconvolution"}
    assert _having(traits.is_fully_connected) == {"InnerProduct"}
    assert _having(traits.folds_scale_before) == {"Convolution"}
    assert _having(traits.folds_bn_after) == _having(traits.is_weighted)


def test_queries_take_a_type_string_a_class_or_a_module_and_unknown_types_have_none():
    lp = pb.LayerParameter(name="c", type="Convolution", bottom=["x"], top=["y"])
    lp.convolution_param.num_output = 2
    lp.convolution_param.kernel_size.append(1)
    mod = ConvolutionLayer(lp, bottom_shapes=[(1, 3, 4, 4)])
    assert traits.weight_layout("Convolution") == traits.weight_layout(ConvolutionLayer) == \
        traits.weight_layout(mod) == "conv"
    assert traits.weight_param(mod) == "convolution_param"
    assert not traits.is_weighted("NoSuchType") and traits.fillers("NoSuchType") is None
    assert not traits.is_per_sample("BatchNormX") and traits.is_per_sample("BatchNorm")


def test_per_layer_params_narrow_the_type():
    def layer(ltype, **params):
        lp = pb.LayerParameter(name="l", type=ltype)
        for field, values in params.items():
            for k, v in values.items():
                sub = getattr(lp, field)
                if isinstance(v, list):
                    getattr(sub, k).extend(v)
                else:
                    setattr(sub, k, v)
        return lp
    assert traits.quantizable_param("Pooling", layer("Pooling", pooling_param={"pool": 1}))
    assert not traits.quantizable_param("Pooling", layer("Pooling", pooling_param={"pool": 0}))
    assert not traits.quantizable_param("Pooling", layer("Pooling", pooling_param={"pool": 1, "global_pooling": True}))
    assert not traits.quantizable_param("Deconvolution", layer("Deconvolution", convolution_param={"dilation": [2]}))
    assert traits.quantizable_param("Convolution", layer("Convolution", convolution_param={"dilation": [2]}))
    assert not traits.quantizable_param("InnerProduct", layer("InnerProduct", inner_product_param={"axis": 2}))
    assert not traits.quantizable_param("ReLU", layer("ReLU"))


def test_the_classes_carry_the_torch_free_table_the_config_code_reads():
    from amct_torch.caffe import quant_types
    from amct_torch.caffe.layers.base import CaffeLayer, layer_class, register
    for t in supported_types():
        assert layer_class(t).quant_type is quant_types.QUANT_TYPES.get(t), t
        assert quant_types.is_channel_wise(t) == traits.is_channel_wise(t), t
    assert quant_types.quantizable_types() == ("Convolution", "Deconvolution", "InnerProduct", "Pooling",
                                               "DepthwiseConvolution", "ConvolutionDepthwise")

    class Mixed(CaffeLayer):
        pass
    with pytest.raises(TypeError, match="quantized differently"):  # one class, a quantized and a plain type
        register("Convolution", "ReLU")(Mixed)
    assert layer_class("Convolution") is ConvolutionLayer and layer_class("ReLU") is not Mixed
