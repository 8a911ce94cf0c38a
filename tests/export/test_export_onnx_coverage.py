"""Every registered Caffe layer type has an ONNX mapping for its class, or says explicitly that
it has no ONNX form (and is then refused with that reason)."""
from __future__ import annotations

import pytest

import amct_torch.export.onnx.layers as onnx_layers
import amct_torch.export.onnx.qdq as qdq
from amct_torch.caffe.layers import layer_class, supported_types
from amct_torch.caffe.layers.activations import ReLULayer
from amct_torch.errors import ExportError
from amct_torch.export.onnx.layers import mapping_of, write_layer
from amct_torch.proto import amct_caffe_pb2 as pb


def test_every_layer_type_has_an_onnx_mapping_or_declares_none():
    classes = {t: layer_class(t) for t in supported_types()}
    unmapped = sorted(t for t, c in classes.items() if not c.no_onnx_form and mapping_of(c) is None)
    assert unmapped == [], f"layer types with neither an ONNX mapping nor no_onnx_form: {unmapped}"
    contradictory = sorted(t for t, c in classes.items() if c.no_onnx_form and c in onnx_layers._MAPPINGS)
    assert contradictory == []


def test_depthwise_forks_inherit_the_convolution_mapping():
    conv = mapping_of(layer_class("Convolution"))
    assert conv is not None
    assert mapping_of(layer_class("DepthwiseConvolution")) is conv
    assert mapping_of(layer_class("ConvolutionDepthwise")) is conv
    assert mapping_of(layer_class("InnerProduct")) is conv
    assert mapping_of(layer_class("Softmax")) is not conv


class _NoForm(ReLULayer):
    no_onnx_form = "a training-only layer"


def test_a_type_without_onnx_form_is_refused_with_its_reason():
    lp = pb.LayerParameter(name="r", type="ReLU", bottom=["a"], top=["a"])
    b = qdq._Builder(None, {}, "uint8", "net.prototxt")
    with pytest.raises(ExportError, match="no ONNX form: a training-only layer") as err:
        write_layer(b, _NoForm(lp), ["a"], [(1, 3)], [(1, 3)])
    assert str(err.value).startswith("net.prototxt, layer 'r': ONNX export: layer type ReLU")
    # the plain ReLU (same parameters) is written by its mapping
    assert write_layer(b, ReLULayer(lp), ["a"], [(1, 3)], [(1, 3)]) == ["r"]
