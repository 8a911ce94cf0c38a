"""Cross-layer equalization (``improve/cle.py``): the float model's outputs stay the same and
the two layers' per-channel ranges become equal, checked by hand on small nets (Convolution,
depthwise, PReLU, InnerProduct); pairs are found only where the rescaling is exact."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe import load_caffe
from amct_torch.caffe.graph import layer_modules
from amct_torch.improve.cle import equalize, find_pairs
from helpers.caffe_nets import make_net, rand


def run(gm, x: torch.Tensor) -> torch.Tensor:
    """The net's (single) output blob."""
    (y,) = gm(x).values()
    return y


TWO = """
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2" convolution_param { num_output: 2 kernel_size: 1 } }
"""


def test_two_layer_ranges_by_hand(tmp_path):
    # c1 output ranges r1 = (4, 1, 0.5); c2 input ranges r2 = (1, 4, 2)
    w1 = np.array([4, -2, 1, 0.5, 1, -1, 0.25, 0.5, -0.5], np.float32).reshape(3, 3, 1, 1)
    b1 = np.array([1.0, -0.5, 0.25], np.float32)
    w2 = np.array([[1, 4, -2], [-0.5, 2, 1]], np.float32).reshape(2, 3, 1, 1)
    b2 = np.array([0.1, -0.2], np.float32)
    proto, model = make_net(tmp_path, TWO, {"data": [1, 3, 4, 4]},
                            {"c1": [w1, b1], "c2": [w2, b2]})
    gm = load_caffe(proto, model)
    x = torch.from_numpy(rand(5, 3, 4, 4, seed=3))
    with torch.no_grad():
        before = run(gm, x).clone()
    pairs = find_pairs(gm)
    assert [(p.first, p.act, p.second) for p in pairs] == [("c1", "r1", "c2")]
    equalize(gm, pairs)
    mods = layer_modules(gm)
    # s_i = sqrt(r1_i / r2_i) = (2, 0.5, 0.5): both ranges become sqrt(r1_i*r2_i) = (2, 2, 1)
    np.testing.assert_allclose(pairs[0].scale.numpy(), [2.0, 0.5, 0.5], rtol=1e-6)
    r1 = mods["c1"].weight.detach().abs().reshape(3, -1).amax(1).numpy()
    r2 = mods["c2"].weight.detach().abs().reshape(2, 3).amax(0).numpy()
    np.testing.assert_allclose(r1, [2.0, 2.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(r2, [2.0, 2.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(mods["c1"].bias.detach().numpy(), b1 / np.array([2, 0.5, 0.5]), rtol=1e-6)
    with torch.no_grad():
        after = run(gm, x)
    assert float((after - before).abs().max() / before.abs().max()) <= 1e-5


CHAIN = """
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "p1" type: "PReLU" bottom: "c1" top: "c1" }
layer { name: "dw" type: "Convolution" bottom: "c1" top: "dw" convolution_param { num_output: 8 group: 8 kernel_size: 3 pad: 1 } }
layer { name: "r2" type: "ReLU" bottom: "dw" top: "dw" }
layer { name: "pw" type: "Convolution" bottom: "dw" top: "pw" convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "p3" type: "PReLU" bottom: "pw" top: "pw" prelu_param { channel_shared: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pw" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "r4" type: "ReLU" bottom: "fc" top: "fc" relu_param { negative_slope: 0.1 } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc" top: "fc2" inner_product_param { num_output: 3 } }
"""


def test_chain_with_depthwise_prelu_and_inner_product_keeps_outputs(tmp_path):
    rng = np.random.default_rng(0)
    spread = np.exp(rng.normal(0, 1.5, (8, 1, 1, 1))).astype(np.float32)  # very unequal channels
    blobs = {"c1": [rand(8, 3, 3, 3, seed=1) * spread, rand(8, seed=2)],
             "p1": [np.abs(rand(8, seed=3)) * 0.3],
             "dw": [rand(8, 1, 3, 3, seed=4), rand(8, seed=5)],
             "pw": [rand(6, 8, 1, 1, seed=6), rand(6, seed=7)],
             "p3": [np.array([0.2], np.float32)],
             "fc": [rand(5, 6 * 6 * 6, seed=8), rand(5, seed=9)],
             "fc2": [rand(3, 5, seed=10), rand(3, seed=11)]}
    proto, model = make_net(tmp_path, CHAIN, {"data": [1, 3, 6, 6]}, blobs)
    gm = load_caffe(proto, model)
    x = torch.from_numpy(rand(4, 3, 6, 6, seed=12))
    with torch.no_grad():
        before = run(gm, x).clone()
    pairs = equalize(gm, find_pairs(gm))
    assert [(p.first, p.second) for p in pairs] == [("c1", "dw"), ("dw", "pw"), ("pw", "fc"), ("fc", "fc2")]
    with torch.no_grad():
        after = run(gm, x)
    assert float((after - before).abs().max() / before.abs().max()) <= 1e-5
    # every pair's ranges per channel equal once the sweeps over the chain have converged:
    # max|W1_i| = max|W2[:, i]| (the depthwise layer's input channel i is its filter i)
    mods = layer_modules(gm)
    w = {n: mods[n].weight.detach() for n in ("c1", "dw", "pw", "fc", "fc2")}
    out_r = {n: t.abs().reshape(t.shape[0], -1).amax(1) for n, t in w.items()}
    np.testing.assert_allclose(out_r["c1"], w["dw"].abs().reshape(8, -1).amax(1), rtol=0.02)
    np.testing.assert_allclose(out_r["dw"], w["pw"].abs().reshape(6, 8).amax(0), rtol=0.02)
    np.testing.assert_allclose(out_r["fc"], w["fc2"].abs().amax(0), rtol=0.02)
    assert float(out_r["c1"].max() / out_r["c1"].min()) < float(spread.max() / spread.min())


def test_no_pair_across_a_branch_or_a_non_homogeneous_activation(tmp_path):
    body = """
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "s1" type: "Sigmoid" bottom: "c1" top: "s1" }
layer { name: "c2" type: "Convolution" bottom: "s1" top: "c2" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "r2" }
layer { name: "c3" type: "Convolution" bottom: "r2" top: "c3" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "c4" type: "Convolution" bottom: "r2" top: "c4" convolution_param { num_output: 4 kernel_size: 1 } }
"""
    blobs = {n: [rand(4, 4, 1, 1, seed=i), rand(4, seed=10 + i)] for i, n in enumerate(("c1", "c2", "c3", "c4"))}
    proto, model = make_net(tmp_path, body, {"data": [1, 4, 3, 3]}, blobs)
    assert find_pairs(load_caffe(proto, model)) == []
