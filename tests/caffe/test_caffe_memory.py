"""The peak activation memory estimated from the declared shapes (amct_torch/caffe/memory.py),
checked against numbers worked by hand from the formula in its docstring, and the refusal of
a batch that cannot fit: a ModelError naming the model file and the layer with the largest
blob, with a batch size that fits."""
from __future__ import annotations

import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.memory import available_memory, check_activation_memory, estimate_activation_memory
from amct_torch.errors import ModelError
from helpers.caffe_nets import make_net, rand

NET = ('layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" '
       'convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n'
       'layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }\n'
       'layer { name: "pool" type: "Pooling" bottom: "conv1" top: "pool" '
       'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
       'layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" inner_product_param { num_output: 10 } }\n')


@pytest.fixture
def small(tmp_path):
    blobs = {"conv1": [rand(4, 3, 3, 3), rand(4)], "fc": [rand(10, 64), rand(10)]}
    return make_net(tmp_path, NET, {"data": (2, 3, 8, 8)}, blobs)


def test_estimate_by_hand(small):
    # per sample (declared batch 2): data 192 values, conv1 256, relu1 256, pool 64, fc 10.
    # live values: data 192 | +conv1 448 | data freed, +relu1 512 (the peak) | conv1 freed,
    # +pool 320 | +fc 74. Largest blob: conv1, 256 values. 4 bytes per value.
    est = estimate_activation_memory(load_caffe(*small))
    assert est.peak_per_sample == 512 * 4 and est.peak_layer == "relu1"
    assert est.largest_per_sample == 256 * 4 and est.largest_layer == "conv1"
    assert est.bytes_at(3) == 3 * (512 + 256) * 4


def test_batch_that_does_not_fit_is_refused_with_a_batch_size_that_fits(small):
    proto, model = small
    gm = load_caffe(proto, model)
    per_sample = (512 + 256) * 4
    check_activation_memory(gm, 5, proto, available=5 * per_sample + 100)
    with pytest.raises(ModelError) as info:
        check_activation_memory(gm, 6, proto, available=5 * per_sample + 100)
    err = info.value
    assert err.file == proto and err.layer == "conv1"
    assert "at most 5" in str(err)


def test_huge_pad_is_refused_even_for_one_sample(tmp_path):
    body = ('layer { name: "wide" type: "Convolution" bottom: "data" top: "wide" '
            'convolution_param { num_output: 16 kernel_size: 3 pad: 1200 } }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 1, 8, 8)}, {"wide": [rand(16, 1, 3, 3), rand(16)]})
    gm = load_caffe(proto, model)  # loading allocates nothing for the activations
    est = estimate_activation_memory(gm)
    assert est.largest_per_sample == 16 * 2406 * 2406 * 4  # (8 + 2400 - 3) + 1 = 2406
    with pytest.raises(ModelError) as info:
        check_activation_memory(gm, 16, proto, available=2 ** 29)
    assert info.value.layer == "wide" and "even one sample" in str(info.value)


def test_available_memory_is_known_on_linux():
    value, where = available_memory("cpu")
    assert value is not None and value > 0 and where
