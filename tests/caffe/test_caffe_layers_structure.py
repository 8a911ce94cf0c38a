"""Eltwise, Concat, Slice, Split, Flatten, Reshape, Permute, Crop, Softmax, ArgMax, Silence
against OpenCV (where it follows Caffe) and numpy."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

S = (2, 3, 4, 5)


@pytest.mark.parametrize("params,ref", [
    ("", lambda a, b, c: a + b + c),
    ("operation: SUM coeff: 0.5 coeff: -2 coeff: 3", lambda a, b, c: 0.5 * a - 2 * b + 3 * c),
    ("operation: PROD", lambda a, b, c: a * b * c),
    ("operation: MAX", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
])
def test_eltwise(tmp_path, params, ref, device):
    body = f'layer {{ name: "e" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "e" eltwise_param {{ {params} }} }}'
    proto, model = make_net(tmp_path, body, {"a": S, "b": S, "c": S})
    xs = [rand(*S, seed=i) for i in range(3)]
    ours = run_ours(proto, model, *xs, device=device)["e"]
    assert_close(ours, ref(*xs), 1e-6)
    assert_close(ours, run_cv(proto, model, dict(zip("abc", xs)), ["e"])["e"], 1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat(tmp_path, axis, device):
    body = f'layer {{ name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" concat_param {{ axis: {axis} }} }}'
    sb = list(S)
    sb[axis] += 2
    proto, model = make_net(tmp_path, body, {"a": S, "b": tuple(sb)})
    a, b = rand(*S, seed=1), rand(*sb, seed=2)
    ours = run_ours(proto, model, a, b, device=device)["cat"]
    assert_close(ours, np.concatenate([a, b], axis=axis), 0)
    assert_close(ours, run_cv(proto, model, {"a": a, "b": b}, ["cat"])["cat"], 0)


@pytest.mark.parametrize("params,sizes,axis", [
    ("slice_point: 1 slice_point: 3", [1, 2, 2], 1),
    ("axis: 2", [2, 2, 2], 2),  # equal parts
    ("axis: -1 slice_point: 2 slice_point: 3", [2, 1, 3], 3),
])
def test_slice_points(tmp_path, params, sizes, axis, device):
    """Each top feeds a Power(scale 2) layer so that OpenCV reports every slice by layer name."""
    shape = [2, 5, 6, 6]
    body = (f'layer {{ name: "sl" type: "Slice" bottom: "data" top: "s0" top: "s1" top: "s2" '
            f'slice_param {{ {params} }} }}\n')
    for i in range(3):
        body += f'layer {{ name: "p{i}" type: "Power" bottom: "s{i}" top: "p{i}" power_param {{ scale: 2 }} }}\n'
    proto, model = make_net(tmp_path, body, {"data": shape})
    x = rand(*shape, seed=1)
    ours = run_ours(proto, model, x, device=device)
    cv = run_cv(proto, model, {"data": x}, ["p0", "p1", "p2"])
    parts = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    for i in range(3):
        assert_close(ours[f"p{i}"], 2 * parts[i], 0)
        assert_close(ours[f"p{i}"], cv[f"p{i}"], 0)


def test_split_feeds_every_consumer(tmp_path):
    body = ('layer { name: "sp" type: "Split" bottom: "data" top: "a" top: "b" }\n'
            'layer { name: "ea" type: "Power" bottom: "a" top: "ea" power_param { scale: 3 } }\n'
            'layer { name: "e" type: "Eltwise" bottom: "ea" bottom: "b" top: "e" }')
    proto, model = make_net(tmp_path, body, {"data": S})
    x = rand(*S, seed=1)
    ours = run_ours(proto, model, x)
    assert list(ours) == ["e"]
    assert_close(ours["e"], 4 * x, 1e-6)
    assert_close(ours["e"], run_cv(proto, model, {"data": x}, ["e"])["e"], 1e-6)


@pytest.mark.parametrize("kind,params,shape,cv", [
    ("Flatten", "", (2, 60), True),
    ("Flatten", "axis: 2", (2, 3, 20), True),
    ("Flatten", "axis: 1 end_axis: 2", (2, 12, 5), True),
    ("Reshape", "shape { dim: 0 dim: -1 }", (2, 60), True),
    ("Reshape", "shape { dim: 0 dim: 0 dim: 20 }", (2, 3, 20), True),
    ("Reshape", "shape { dim: -1 dim: 5 dim: 4 }", (6, 5, 4), True),
    ("Reshape", "shape { dim: 2 dim: 2 } axis: 2 num_axes: 1", (2, 3, 2, 2, 5), True),
    ("Reshape", "shape { dim: -1 } axis: 1", (2, 60), True),
    ("Reshape", "shape { dim: 1 } axis: -1 num_axes: 0", (2, 3, 4, 5, 1), False),
    ("Reshape", "shape { dim: 0 dim: 0 dim: 0 dim: 0 } axis: 0", (2, 3, 4, 5), True),
])
def test_flatten_and_reshape(tmp_path, kind, params, shape, cv, device):
    """The output is the input reshaped to ``shape`` (and OpenCV's, where it takes the params)."""
    body = f'layer {{ name: "y" type: "{kind}" bottom: "data" top: "y" {kind.lower()}_param {{ {params} }} }}'
    proto, model = make_net(tmp_path, body, {"data": S})
    x = rand(*S, seed=1)
    ours = run_ours(proto, model, x, device=device)["y"]
    assert ours.shape == shape
    assert_close(ours, x.reshape(shape), 0)
    if cv:
        assert_close(ours, run_cv(proto, model, {"data": x}, ["y"])["y"], 0)


@pytest.mark.parametrize("order", [[0, 2, 3, 1], [0, 3, 1, 2], [0, 1, 3], [1, 0]])
def test_permute(tmp_path, order, device):
    body = f'layer {{ name: "p" type: "Permute" bottom: "data" top: "p" permute_param {{ {" ".join(f"order: {o}" for o in order)} }} }}'
    proto, model = make_net(tmp_path, body, {"data": S})
    x = rand(*S, seed=1)
    full = order + [i for i in range(4) if i not in order]
    ours = run_ours(proto, model, x, device=device)["p"]
    assert_close(ours, np.transpose(x, full), 0)
    if len(order) == 4:  # OpenCV needs the full order (Caffe appends the missing axes)
        cvout = run_cv(proto, model, {"data": x}, ["p"])["p"]
        assert cvout.shape == ours.shape
        assert_close(ours, cvout, 0)


@pytest.mark.parametrize("params,sl", [
    ("", (slice(None), slice(None), slice(0, 3), slice(0, 4))),
    ("axis: 2 offset: 1 offset: 2", (slice(None), slice(None), slice(1, 4), slice(2, 6))),
    ("axis: 1 offset: 1", (slice(None), slice(1, 3), slice(1, 4), slice(1, 5))),
])
def test_crop(tmp_path, params, sl, device):
    body = f'layer {{ name: "c" type: "Crop" bottom: "data" bottom: "ref" top: "c" crop_param {{ {params} }} }}'
    ref_shape = (2, 2, 3, 4)
    proto, model = make_net(tmp_path, body, {"data": (2, 3, 5, 7), "ref": ref_shape})
    x, r = rand(2, 3, 5, 7, seed=1), rand(*ref_shape, seed=2)
    if "axis: 1" not in params:
        sl = sl[:1] + (slice(None),) + sl[2:]
    expected = x[sl]
    ours = run_ours(proto, model, x, r, device=device)["c"]
    assert_close(ours, expected, 0)
    assert_close(ours, run_cv(proto, model, {"data": x, "ref": r}, ["c"])["c"], 0)


@pytest.mark.parametrize("params,axis", [("", 1), ("softmax_param { axis: 2 }", 2), ("softmax_param { axis: -1 }", 3)])
def test_softmax_axis(tmp_path, params, axis, device):
    body = f'layer {{ name: "sm" type: "Softmax" bottom: "data" top: "sm" {params} }}'
    proto, model = make_net(tmp_path, body, {"data": S})
    x = rand(*S, seed=1, scale=3)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    ours = run_ours(proto, model, x, device=device)["sm"]
    assert_close(ours, e / e.sum(axis=axis, keepdims=True), 1e-6)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["sm"])["sm"], 1e-6)


@pytest.mark.parametrize("params", ["", "top_k: 3", "top_k: 2 out_max_val: true", "axis: 1 top_k: 2",
                                    "axis: 3 out_max_val: true"])
def test_argmax(tmp_path, params, device):
    """Caffe's ArgMax: per sample over everything after axis 0 (shape (N, 1|2, top_k, 1)), or
    along ``axis`` (indices, or values with out_max_val). Plain numpy reference."""
    body = f'layer {{ name: "am" type: "ArgMax" bottom: "data" top: "am" argmax_param {{ {params} }} }}'
    proto, model = make_net(tmp_path, body, {"data": S})
    x = rand(*S, seed=1)
    ours = run_ours(proto, model, x, device=device)["am"]
    k = int(params.split("top_k: ")[1].split()[0]) if "top_k" in params else 1
    if "axis" in params:
        ax = int(params.split("axis: ")[1].split()[0])
        idx = np.flip(np.argsort(x, axis=ax, kind="stable"), axis=ax).take(range(k), axis=ax)
        ref = np.take_along_axis(x, idx, ax) if "out_max_val" in params else idx.astype(np.float32)
    else:
        flat = x.reshape(2, -1)
        idx = np.argsort(-flat, axis=1, kind="stable")[:, :k]
        if "out_max_val" in params:
            ref = np.stack([idx.astype(np.float32), np.take_along_axis(flat, idx, 1)], axis=1)[..., None]
        else:
            ref = idx.astype(np.float32)[:, None, :, None]
    assert ours.shape == ref.shape
    assert_close(ours, ref, 0)


def test_silence_and_dropout(tmp_path):
    """Silence consumes a blob (so it is no output); Dropout is the identity at test time."""
    body = ('layer { name: "d" type: "Dropout" bottom: "data" top: "d" }\n'
            'layer { name: "s" type: "Silence" bottom: "other" }')
    proto, model = make_net(tmp_path, body, {"data": S, "other": S})
    x = rand(*S, seed=1)
    ours = run_ours(proto, model, x, rand(*S, seed=2))
    assert list(ours) == ["d"]
    assert_close(ours["d"], x, 0)
