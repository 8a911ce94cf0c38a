"""The graph contract: inputs in declared order, dict of unconsumed tops, in-place layers,
multi-top layers, names, meta tags, any input size for fully convolutional nets."""
from __future__ import annotations

import copy

import numpy as np
import torch

from amct_torch import load_caffe
from amct_torch.caffe import CaffeLayer, layer_modules
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

FCN = '''
layer { name: "conv/1-a.b" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "relu" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "pool" type: "Pooling" bottom: "c1" top: "p" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "slice" type: "Slice" bottom: "p" top: "s0" top: "s1" slice_param { slice_point: 1 } }
layer { name: "forward" type: "Eltwise" bottom: "s0" bottom: "s0" top: "sum" }
'''


def _fcn(tmp_path):
    blobs = {"conv/1-a.b": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)],
             "bn": [rand(4, seed=3), np.abs(rand(4, seed=4)) + 1, np.ones(1, np.float32)]}
    return make_net(tmp_path, FCN, {"data": (1, 3, 16, 16)}, blobs)


def test_outputs_are_unconsumed_tops(tmp_path):
    proto, model = _fcn(tmp_path)
    x = rand(2, 3, 16, 16, seed=5)
    out = run_ours(proto, model, x)
    assert sorted(out) == ["s1", "sum"]
    cv = run_cv(proto, model, {"data": x}, ["forward", "pool"])
    assert_close(out["sum"], cv["forward"], 1e-5)
    assert_close(out["s1"], cv["pool"][:, 1:], 1e-5)


def test_any_input_size(tmp_path, device):
    """Nothing about the declared 16x16 is baked in."""
    proto, model = _fcn(tmp_path)
    for hw in [(16, 16), (23, 31), (9, 40)]:
        x = rand(1, 3, *hw, seed=6)
        out = run_ours(proto, model, x, device=device)
        assert_close(out["sum"], run_cv(proto, model, {"data": x}, ["forward"])["forward"], 1e-5)


def test_names_meta_and_modules(tmp_path):
    proto, model = _fcn(tmp_path)
    gm = load_caffe(proto, model)
    mods = layer_modules(gm)
    assert list(mods) == ["conv/1-a.b", "bn", "relu", "pool", "slice", "forward"]
    assert all(isinstance(m, CaffeLayer) for m in mods.values())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            assert node.meta["caffe_layer"] == mod.caffe_name
            assert node.meta["caffe_type"] == mod.caffe_type
            assert node.target.isidentifier()
        if node.op == "call_function":  # getitem of the multi-top Slice
            assert node.meta["caffe_layer"] == "slice"
    assert mods["conv/1-a.b"].layer_param.name == "conv/1-a.b" and not mods["bn"].layer_param.blobs
    assert [w.shape for w in mods["bn"].caffe_blobs()] == [(4,), (4,), (1,)]
    assert gm.caffe_inputs == [("data", [1, 3, 16, 16])]
    assert [l.name for l in gm.caffe_net.layer][0] == "data"
    clone = copy.deepcopy(gm)
    assert clone.caffe_net == gm.caffe_net and clone.caffe_inputs == gm.caffe_inputs


def test_inputs_in_declared_order(tmp_path):
    body = 'layer { name: "d" type: "Eltwise" bottom: "b" bottom: "a" top: "d" eltwise_param { coeff: 1 coeff: -1 } }'
    proto, model = make_net(tmp_path, body, {"b": (1, 2), "a": (1, 2)})
    b, a = rand(1, 2, seed=1), rand(1, 2, seed=2)
    assert_close(run_ours(proto, model, b, a)["d"], b - a, 1e-6)


def test_without_weights_file(tmp_path):
    """No caffemodel: parameters are sized from the declared input shapes, zeros / identity BN."""
    proto, _ = _fcn(tmp_path)
    gm = load_caffe(proto)
    assert tuple(layer_modules(gm)["conv/1-a.b"].weight.shape) == (4, 3, 3, 3)
    with torch.no_grad():
        out = gm(torch.ones(1, 3, 16, 16))
    assert float(out["sum"].abs().max()) < 1e-2  # zero conv, mean 0 / var 1 BN


def test_caffe_blobs_round_trip_shapes(tmp_path):
    """Each module returns Caffe's blob order and shapes, with the values it was loaded with."""
    w, b = rand(4, 3, 3, 3, seed=1), rand(4, seed=2)
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }\n'
            'layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 2 transpose: true } }')
    fw = rand(4 * 6 * 6, 2, seed=3)
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 8, 8)}, {"conv": [w, b], "fc": [fw, rand(2, seed=4)]})
    mods = layer_modules(load_caffe(proto, model))
    cw, cb = mods["conv"].caffe_blobs()
    assert np.array_equal(cw, w) and np.array_equal(cb, b)
    assert mods["fc"].weight.shape == (2, 144)
    assert np.array_equal(mods["fc"].caffe_blobs()[0], fw)


def test_inplace_reuse_only_when_no_one_else_reads(tmp_path):
    """conv output 'c' feeds ReLU and Power: the ReLU must not overwrite it; the BN after a
    single-use conv may. Results equal OpenCV's with in-place reuse on and off."""
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 3 kernel_size: 1 } }\n'
            'layer { name: "relu" type: "ReLU" bottom: "c" top: "r" }\n'
            'layer { name: "pow" type: "Power" bottom: "c" top: "p" power_param { scale: 2 } }\n'
            'layer { name: "sum" type: "Eltwise" bottom: "r" bottom: "p" top: "sum" }\n'
            'layer { name: "conv2" type: "Convolution" bottom: "sum" top: "c2" convolution_param { num_output: 3 kernel_size: 1 } }\n'
            'layer { name: "bn" type: "BatchNorm" bottom: "c2" top: "c2" }\n'
            'layer { name: "relu2" type: "ReLU" bottom: "c2" top: "c2" }')
    blobs = {"conv": [rand(3, 3, 1, 1, seed=1), rand(3, seed=2)], "conv2": [rand(3, 3, 1, 1, seed=3), rand(3, seed=4)],
             "bn": [rand(3, seed=5), np.ones(3, np.float32), np.ones(1, np.float32)]}
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 5, 5)}, blobs)
    from amct_torch.caffe.graph import set_inplace
    gm = load_caffe(proto, model)
    mods = layer_modules(gm)
    assert not mods["relu"].inplace and mods["sum"].inplace and mods["bn"].inplace and mods["relu2"].inplace
    x = rand(1, 3, 5, 5, seed=6)
    ref = run_cv(proto, model, {"data": x}, ["relu2"])["relu2"]
    with torch.no_grad():
        assert_close(gm(torch.from_numpy(x))["c2"].numpy(), ref, 1e-5)
    set_inplace(gm, False)
    assert not any(m.inplace for m in layer_modules(gm).values())
    assert_close(gm(torch.from_numpy(x))["c2"].detach().numpy(), ref, 1e-5)
