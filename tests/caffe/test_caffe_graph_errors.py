"""Graph-level model errors: each is a ModelError naming the file and the layer."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch import ModelError, load_caffe
from helpers.caffe_nets import make_net, rand

CONV = 'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }\n'


def _expect(proto, model, layer, words):
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    err = info.value
    assert err.layer == layer
    assert err.file in (proto, model)
    assert all(w in str(err) for w in words), str(err)


def test_unknown_layer_type(tmp_path):
    proto, model = make_net(tmp_path, 'layer { name: "odd" type: "FancyOp" bottom: "data" top: "x" }',
                            {"data": (1, 3, 8, 8)})
    _expect(proto, model, "odd", ["FancyOp", "unknown layer type"])


def test_missing_bottom(tmp_path):
    proto, model = make_net(tmp_path, 'layer { name: "r" type: "ReLU" bottom: "nothere" top: "r" }',
                            {"data": (1, 3, 8, 8)})
    _expect(proto, model, "r", ["nothere"])


def test_cycle(tmp_path):
    body = ('layer { name: "a" type: "ReLU" bottom: "b_out" top: "a_out" }\n'
            'layer { name: "b" type: "ReLU" bottom: "a_out" top: "b_out" }')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 8, 8)})
    _expect(proto, model, "a", ["b_out", "cycle"])


def test_blob_count_mismatch(tmp_path):
    proto, model = make_net(tmp_path, CONV, {"data": (1, 3, 8, 8)}, {"conv": [rand(4, 3, 3, 3)]})
    _expect(proto, model, "conv", ["2 weight blob", "has 1"])


def test_conv_weight_shape_does_not_fit_num_output(tmp_path):
    proto, model = make_net(tmp_path, CONV, {"data": (1, 3, 8, 8)}, {"conv": [rand(5, 3, 3, 3), rand(4)]})
    _expect(proto, model, "conv", ["weight", "[4, 3, 3, 3]"])


def test_conv_weight_does_not_fit_input_channels(tmp_path):
    proto, model = make_net(tmp_path, CONV, {"data": (1, 2, 8, 8)}, {"conv": [rand(4, 3, 3, 3), rand(4)]})
    _expect(proto, model, "conv", ["weight"])


def test_inner_product_does_not_fit_input(tmp_path):
    body = 'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 2 } }'
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)}, {"fc": [rand(2, 50), rand(2)]})
    _expect(proto, model, "fc", ["weight"])


def test_batchnorm_channels_mismatch(tmp_path):
    body = 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "data" }'
    blobs = {"bn": [rand(4), np.ones(4, np.float32), np.ones(1, np.float32)]}
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)}, blobs)
    _expect(proto, model, "bn", ["4", "3 channels"])


def test_eltwise_shape_mismatch(tmp_path):
    body = 'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "e" }'
    proto, model = make_net(tmp_path, body, {"a": (1, 3, 4, 4), "b": (1, 3, 4, 5)})
    _expect(proto, model, "e", ["shape"])


def test_shape_error_from_meta_run(tmp_path):
    """Concat of incompatible shapes is found at load time by running the layer on meta tensors."""
    body = 'layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }'
    proto, model = make_net(tmp_path, body, {"a": (1, 3, 4, 4), "b": (1, 3, 5, 4)})
    _expect(proto, model, "cat", ["Concat", "[1, 3, 5, 4]"])


def test_layer_takes_no_weights(tmp_path):
    body = 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }'
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)}, {"r": [rand(3)]})
    _expect(proto, model, "r", ["no weights"])


def test_missing_weights_in_caffemodel(tmp_path):
    proto, model = make_net(tmp_path, CONV, {"data": (1, 3, 8, 8)})
    _expect(proto, model, "conv", ["weight blob"])


def test_bad_params(tmp_path):
    body = 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX } }'
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 4, 4)})
    _expect(proto, model, "p", ["kernel_size"])
