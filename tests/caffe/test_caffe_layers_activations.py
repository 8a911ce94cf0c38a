"""Element-wise layers against OpenCV (where it has them) and plain numpy formulas."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours

X_SHAPE = (2, 3, 5, 4)

CASES = [  # (type, params text, numpy reference, OpenCV supports it)
    ("ReLU", "", lambda x: np.maximum(x, 0), True),
    ("ReLU", "relu_param { negative_slope: 0.1 }", lambda x: np.where(x > 0, x, 0.1 * x), True),
    ("Sigmoid", "", lambda x: 1 / (1 + np.exp(-x)), True),
    ("TanH", "", np.tanh, True),
    ("ELU", "", lambda x: np.where(x > 0, x, np.exp(x) - 1), True),
    ("ELU", "elu_param { alpha: 0.5 }", lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)), False),
    ("AbsVal", "", np.abs, True),
    ("BNLL", "", lambda x: np.log1p(np.exp(x)), True),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1.5 }", lambda x: (1.5 + 0.5 * x) ** 2, True),
    ("Exp", "", np.exp, True),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 0.25 }", lambda x: 2.0 ** (0.25 + 0.5 * x), True),
    ("Log", "log_param { shift: 5 scale: 1 }", lambda x: np.log(5 + x), False),
    ("Log", "log_param { base: 10 shift: 6 scale: 0.5 }", lambda x: np.log10(6 + 0.5 * x), False),
    ("Threshold", "threshold_param { threshold: 0.3 }", lambda x: (x > 0.3).astype(np.float32), False),
    ("Clip", "clip_param { min: -0.5 max: 0.7 }", lambda x: np.clip(x, -0.5, 0.7), False),
    ("Dropout", "dropout_param { dropout_ratio: 0.3 }", lambda x: x, True),
    ("Swish", "", lambda x: x / (1 + np.exp(-x)), False),
]


@pytest.mark.parametrize("ltype,params,ref,cv", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_elementwise(tmp_path, ltype, params, ref, cv, device):
    body = f'layer {{ name: "l" type: "{ltype}" bottom: "data" top: "l" {params} }}'
    proto, model = make_net(tmp_path, body, {"data": X_SHAPE})
    x = rand(*X_SHAPE, seed=1)
    ours = run_ours(proto, model, x, device=device)["l"]
    assert_close(ours, ref(x.astype(np.float64)), 1e-5)
    if cv:
        assert_close(ours, run_cv(proto, model, {"data": x}, ["l"])["l"], 1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_prelu(tmp_path, shared, device):
    body = f'layer {{ name: "l" type: "PReLU" bottom: "data" top: "l" prelu_param {{ channel_shared: {str(shared).lower()} }} }}'
    slope = rand(1 if shared else 3, seed=2)
    proto, model = make_net(tmp_path, body, {"data": X_SHAPE}, {"l": [slope]})
    x = rand(*X_SHAPE, seed=1)
    ours = run_ours(proto, model, x, device=device)["l"]
    a = slope.reshape(1, -1, 1, 1)
    assert_close(ours, np.where(x > 0, x, a * x), 1e-6)
    assert_close(ours, run_cv(proto, model, {"data": x}, ["l"])["l"], 1e-6)
