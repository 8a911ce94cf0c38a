"""A MaxPool after an integer-form layer (ConvInteger → rescale → PReLU/ReLU → MaxPool → the next
layer's QuantizeLinear) is written right after the int32 → float Cast.

Why it matters (ONNX Runtime 1.32): with the MaxPool in front of the Q, ORT's QDQ propagation
copies the pair across it and runs the pooling on uint8 codes in NCHW, a generic kernel many
times slower than the float one: the PReLU face net ran 2-3x slower in int8 than in float.

What is checked, in ONNX Runtime itself:
- in ORT's optimized graph no MaxPool reads QuantizeLinear codes any more (before: every one);
- the numbers are the same bit for bit as the model written with the MaxPool where it was
  (``_pool_first`` switched off), with ORT's optimizations on and off: max commutes with the
  non-decreasing rescale and activation;
- a PReLU with a negative slope (not monotone) keeps its MaxPool where it was.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import amct_torch.export.onnx.integer as integer
from amct_torch.caffe.graph import load_caffe
from amct_torch.export import export_onnx
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net, rand
from helpers.data import natural_images_bgr
from helpers.exports import minmax_records
from helpers.runtimes import ort_counts, ort_optimized_model, ort_run
from helpers.target_nets import onet_like


def _pools_on_codes(model: onnx.ModelProto) -> int:
    """MaxPools of ORT's optimized graph whose input is a QuantizeLinear's output (uint8 codes)."""
    prod = {o: n for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type == "MaxPool"
               and prod.get(n.input[0]) is not None and prod[n.input[0]].op_type == "QuantizeLinear")


def _export_both(gm, recs, tmp_path, monkeypatch) -> tuple[str, str]:
    """(the default export, the same export with the MaxPools left where they were)."""
    _, moved = export_onnx(gm, recs, str(tmp_path / "moved"))
    with monkeypatch.context() as m:
        m.setattr(integer, "_pool_first", lambda b, outputs: 0)
        _, kept = export_onnx(gm, recs, str(tmp_path / "kept"))
    return moved, kept


def test_prelu_net_pools_in_float_with_the_same_numbers(tmp_path, monkeypatch):
    gm = fuse_bn(load_caffe(*onet_like(tmp_path))).graph
    x = np.ascontiguousarray(natural_images_bgr(size=48, count=10, seed=1) / 128, np.float32)
    recs = minmax_records(gm, torch.from_numpy(x[:2]))
    moved, kept = _export_both(gm, recs, tmp_path, monkeypatch)
    ops = [n.op_type for n in onnx.load(moved).graph.node]
    # each of the three MaxPools reads a Cast (the integer form's accumulator as float)
    m = onnx.load(moved)
    prod = {o: n for n in m.graph.node for o in n.output}
    pools = [n for n in m.graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 3 and all(prod[p.input[0]].op_type == "Cast" for p in pools), ops
    # ORT: every MaxPool on uint8 codes before, none now
    assert _pools_on_codes(ort_optimized_model(kept)) == 3
    assert _pools_on_codes(ort_optimized_model(moved)) == 0
    # every convolution and FC still an int8 kernel (ORT's channel-scaling Conv aside)
    assert ort_counts(moved) == {"conv_int8": 4, "conv_float": 0, "fc_int8": 4, "fc_float": 0}
    for level in ("DISABLE_ALL", "ENABLE_ALL"):
        a, b = ort_run(moved, x[2:], level), ort_run(kept, x[2:], level)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), level


@pytest.mark.parametrize("slope_sign", [1.0, -1.0])
def test_monotone_activations_only(tmp_path, monkeypatch, slope_sign):
    """ReLU and a PReLU with slopes ≥ 0 are crossed; a negative slope is not (max would not
    commute); either way the numbers equal the unmoved model's."""
    body = ('layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 } }\n'
            'layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" }\n'
            'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }\n'
            'layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" relu_param { negative_slope: 0.1 } }\n'
            'layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            'layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3" convolution_param { num_output: 4 kernel_size: 1 } }\n')
    slope = np.abs(rand(8, seed=3)) * 0.25
    slope[::2] *= slope_sign
    proto, model = make_net(tmp_path, body, {"data": [1, 3, 20, 20]},
                            {"conv1": [rand(8, 3, 3, 3, seed=1) * 0.3, rand(8, seed=2) * 0.1], "prelu1": [slope],
                             "conv2": [rand(8, 8, 3, 3, seed=4) * 0.2, rand(8, seed=5) * 0.1],
                             "conv3": [rand(4, 8, 1, 1, seed=6) * 0.3, rand(4, seed=7) * 0.1]})
    gm = fuse_bn(load_caffe(proto, model)).graph
    x = rand(6, 3, 20, 20, seed=8)
    recs = minmax_records(gm, torch.from_numpy(x[:2]))
    # the ReLU's zero point is not at the grid minimum (a leaky ReLU): conv2 takes the integer form
    moved, kept = _export_both(gm, recs, tmp_path, monkeypatch)
    m = onnx.load(moved)
    prod = {o: n for n in m.graph.node for o in n.output}
    before = {p.name: prod[p.input[0]].op_type for p in m.graph.node if p.op_type == "MaxPool"}
    assert before["pool2_MaxPool"] == "Cast", before
    assert before["pool1_MaxPool"] == ("Cast" if slope_sign > 0 else "PRelu"), before
    for level in ("DISABLE_ALL", "ENABLE_ALL"):
        a, b = ort_run(moved, x[2:], level), ort_run(kept, x[2:], level)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), level
