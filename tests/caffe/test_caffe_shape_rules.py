"""The loader's shape rules (``infer_shapes``) against what the layers really produce.

Why: ``build_graph`` pushes the declared input shapes through every layer without running it
(a meta-device forward made torch import its compiler stack, ~1 s, on first use). Each rule
must give exactly the shape the real forward gives, and refuse what the forward refuses."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.errors import ModelError
from helpers.caffe_nets import make_net, rand

S = (2, 3, 4, 5)

CASES = {
    "scale_bias_axis1": ('layer { name: "s" type: "Scale" bottom: "a" top: "s" scale_param { bias_term: true } }',
                         {"a": S}, {"s": [rand(3), rand(3, seed=1)]}),
    "scale_two_axes": ('layer { name: "s" type: "Scale" bottom: "a" top: "s" scale_param { axis: 1 num_axes: 2 } }',
                       {"a": S}, {"s": [rand(3, 4)]}),
    "scale_last_axis": ('layer { name: "s" type: "Scale" bottom: "a" top: "s" scale_param { axis: -1 num_axes: -1 } }',
                        {"a": S}, {"s": [rand(5)]}),
    "scale_two_bottoms": ('layer { name: "s" type: "Scale" bottom: "a" bottom: "g" top: "s" scale_param { axis: 1 bias_term: true } }',
                          {"a": S, "g": (3, 4)}, {"s": [rand(12)]}),
    "bias_blob": ('layer { name: "b" type: "Bias" bottom: "a" top: "b" bias_param { axis: 2 num_axes: 1 } }',
                  {"a": S}, {"b": [rand(4)]}),
    "bias_two_bottoms": ('layer { name: "b" type: "Bias" bottom: "a" bottom: "g" top: "b" }',
                         {"a": S, "g": (3,)}, {}),
    "concat_axis0": ('layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "c" concat_param { axis: 0 } }',
                     {"a": S, "b": (4, 3, 4, 5)}, {}),
    "concat_last": ('layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "c" concat_param { axis: -1 } }',
                    {"a": S, "b": (2, 3, 4, 1)}, {}),
    "slice_points": ('layer { name: "sl" type: "Slice" bottom: "a" top: "x" top: "y" top: "z" '
                     'slice_param { axis: 3 slice_point: 1 slice_point: 3 } }', {"a": S}, {}),
    "slice_equal": ('layer { name: "sl" type: "Slice" bottom: "a" top: "x" top: "y" slice_param { axis: 0 } }',
                    {"a": S}, {}),
    "split": ('layer { name: "sp" type: "Split" bottom: "a" top: "x" top: "y" }', {"a": S}, {}),
    "flatten_default": ('layer { name: "f" type: "Flatten" bottom: "a" top: "f" }', {"a": S}, {}),
    "flatten_middle": ('layer { name: "f" type: "Flatten" bottom: "a" top: "f" flatten_param { axis: 1 end_axis: 2 } }',
                       {"a": S}, {}),
    "reshape_zero_minus1": ('layer { name: "r" type: "Reshape" bottom: "a" top: "r" '
                            'reshape_param { shape { dim: 0 dim: -1 dim: 2 } } }', {"a": S}, {}),
    "reshape_axis": ('layer { name: "r" type: "Reshape" bottom: "a" top: "r" '
                     'reshape_param { axis: 2 num_axes: 1 shape { dim: 2 dim: 2 } } }', {"a": S}, {}),
    "permute": ('layer { name: "p" type: "Permute" bottom: "a" top: "p" permute_param { order: 0 order: 2 order: 3 order: 1 } }',
                {"a": S}, {}),
    "deconv_stride_pad": ('layer { name: "d" type: "Deconvolution" bottom: "a" top: "d" '
                          'convolution_param { num_output: 4 kernel_size: 4 stride: 2 pad: 1 } }',
                          {"a": S}, {"d": [rand(3, 4, 4, 4), rand(4)]}),
    "deconv_group_rect": ('layer { name: "d" type: "Deconvolution" bottom: "a" top: "d" '
                          'convolution_param { num_output: 4 kernel_h: 3 kernel_w: 2 stride_h: 3 stride_w: 1 group: 2 bias_term: false } }',
                          {"a": (1, 4, 3, 3)}, {"d": [rand(4, 2, 3, 2)]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_gives_the_forward_shape(tmp_path, case):
    body, inputs, blobs = CASES[case]
    proto, model = make_net(tmp_path, body, inputs, blobs)
    gm = load_caffe(proto, model)
    seen = []
    for mod in gm.modules():
        if hasattr(mod, "infer_shapes") and mod is not gm:
            def hook(m, args, out):
                outs = out if isinstance(out, tuple) else (out,)
                seen.append((m, [tuple(a.shape) for a in args], [tuple(o.shape) for o in outs]))
            mod.register_forward_hook(hook)
    xs = [torch.from_numpy(rand(*s, seed=i)) for i, s in enumerate(inputs.values())]
    with torch.no_grad():
        gm(*xs)
    assert seen
    for mod, in_shapes, out_shapes in seen:
        rule = mod.infer_shapes(in_shapes)
        assert rule is not None, f"{mod.caffe_type} has no shape rule"
        assert [tuple(r) for r in rule] == out_shapes, mod.caffe_type


BAD = {
    "scale_second_bottom": ('layer { name: "s" type: "Scale" bottom: "a" bottom: "g" top: "s" }', {"a": S, "g": (3,)},
                            {}, (4,)),
    "concat_mismatch": ('layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "c" }', {"a": S, "b": S}, {},
                        (2, 3, 4, 6)),
    "slice_points_too_far": ('layer { name: "sl" type: "Slice" bottom: "a" top: "x" top: "y" '
                             'slice_param { axis: 1 slice_point: 3 } }', {"a": S}, {}, None),
    "reshape_count": ('layer { name: "r" type: "Reshape" bottom: "a" top: "r" reshape_param { shape { dim: 7 dim: -1 } } }',
                      {"a": S}, {}, None),
    "deconv_empty_output": ('layer { name: "d" type: "Deconvolution" bottom: "a" top: "d" '
                            'convolution_param { num_output: 2 kernel_size: 1 pad: 2 } }', {"a": (1, 3, 1, 1)},
                            {"d": [rand(3, 2, 1, 1), rand(2)]}, None),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rule_refuses_what_the_forward_refuses(tmp_path, case):
    """A misfit named at load time (file and layer), and the forward refuses the same shapes."""
    body, inputs, blobs, second = BAD[case]
    if second is not None:  # the second bottom's declared shape is the misfit one
        names = list(inputs)
        inputs = dict(inputs)
        inputs[names[-1]] = second
    proto, model = make_net(tmp_path, body, inputs, blobs)
    with pytest.raises(ModelError) as err:
        load_caffe(proto, model)
    assert err.value.layer in ("s", "c", "sl", "r", "d")
    # the same layer built without shapes (nothing checked at load) fails when run on them
    from amct_torch.caffe.graph import build_graph
    from amct_torch.caffe.netio import read_net
    gm = build_graph(read_net(proto, model), check_shapes=False)
    xs = [torch.from_numpy(rand(*s, seed=i)) for i, s in enumerate(inputs.values())]
    with pytest.raises((ModelError, RuntimeError)), torch.no_grad():
        gm(*xs)


def test_nsfw_load_runs_no_meta_forward(nsfw_model):
    """Loading the ResNet-50 (BatchNorm, Scale, Eltwise, Pooling, InnerProduct, Softmax) runs no
    layer on the meta device, so torch never imports its compiler stack (torch._dynamo, ~1 s)."""
    code = ("import sys, torch\nfrom amct_torch.caffe.graph import load_caffe\n"
            f"load_caffe({nsfw_model[0]!r}, {nsfw_model[1]!r})\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "False"
