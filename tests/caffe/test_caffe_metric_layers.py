"""Caffe's metric and loss layers against their definitions written out as loops (as in
Caffe's accuracy_layer.cpp, softmax_loss_layer.cpp, sigmoid_cross_entropy_loss_layer.cpp,
euclidean_loss_layer.cpp), with hand-worked cases for the tie rule and the normalizations."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from google.protobuf import text_format

from amct_torch.caffe.head import NetHead
from amct_torch.caffe.layers import layer_class
from amct_torch.errors import DataError
from amct_torch.proto import amct_caffe_pb2 as pb


def _layer(text: str):
    lp = text_format.Parse(text, pb.LayerParameter())
    return layer_class(lp.type)(lp, None, None)


def _accuracy_loop(x, lab, top_k, ignore=None):
    right = count = 0
    for i in range(x.shape[0]):
        for j in range(x.shape[2]):
            lv = int(lab[i, j])
            if ignore is not None and lv == ignore:
                continue
            better = -1
            for k in range(x.shape[1]):
                better += x[i, k, j] >= x[i, lv, j]
            right += better < top_k
            count += 1
    return 0.0 if count == 0 else right / count


def test_accuracy_tie_rule_hand_worked():
    acc = _layer('name: "a" type: "Accuracy" bottom: "s" bottom: "l" top: "acc"')
    scores = torch.tensor([[1.0, 3.0, 3.0], [5.0, 1.0, 2.0], [0.0, 0.0, 1.0]])
    # row 0: label 1 ties with class 2 -> wrong (a tie counts against); row 1: right; row 2: wrong
    assert float(acc(scores, torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(1 / 3)
    top2 = _layer('name: "a" type: "Accuracy" bottom: "s" bottom: "l" top: "acc" accuracy_param { top_k: 2 }')
    assert float(top2(scores, torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(2 / 3)


@pytest.mark.parametrize("top_k,ignore", [(1, None), (3, None), (2, 4)])
def test_accuracy_axis_and_ignore_against_the_loop(top_k, ignore):
    rng = np.random.default_rng(top_k)
    x = rng.integers(0, 4, size=(3, 6, 5)).astype(np.float32)  # small integers: many ties
    lab = rng.integers(0, 6, size=(3, 5)).astype(np.float32)
    param = f"top_k: {top_k} axis: 1" + (f" ignore_label: {ignore}" if ignore is not None else "")
    acc = _layer(f'name: "a" type: "Accuracy" bottom: "s" bottom: "l" top: "acc" top: "per_class" '
                 f'accuracy_param {{ {param} }}')
    got, per_class = acc(torch.tensor(x), torch.tensor(lab))
    assert float(got) == pytest.approx(_accuracy_loop(x, lab, top_k, ignore))
    for c in range(6):  # per class: the same rule over that class's labels
        sel = lab == c
        if ignore is not None and c == ignore or not sel.any():
            continue
        masked = np.where(sel, lab, -1.0)
        assert float(per_class[c]) == pytest.approx(_accuracy_loop(x, masked, top_k, ignore=-1))


def test_accuracy_label_out_of_range_names_the_layer():
    acc = _layer('name: "top1" type: "Accuracy" bottom: "s" bottom: "l" top: "acc"')
    with pytest.raises(DataError, match="label 5 is out of range for 3 classes") as err:
        acc(torch.zeros(2, 3), torch.tensor([0.0, 5.0]))
    assert err.value.layer == "top1"
    with pytest.raises(DataError, match="label -1"):
        acc(torch.zeros(2, 3), torch.tensor([0.0, -1.0]))
    ignoring = _layer('name: "a" type: "Accuracy" bottom: "s" bottom: "l" top: "acc" accuracy_param { ignore_label: -1 }')
    assert float(ignoring(torch.tensor([[0.0, 1.0, 0.0]] * 2), torch.tensor([1.0, -1.0]))) == 1.0


def _softmax_loss_loop(x, lab, mode, ignore=None):
    outer, classes, inner = x.shape
    loss, count = 0.0, 0
    for i in range(outer):
        for j in range(inner):
            lv = int(lab[i, j])
            if ignore is not None and lv == ignore:
                continue
            e = np.exp(x[i, :, j] - x[i, :, j].max())
            loss -= math.log(max(e[lv] / e.sum(), np.finfo(np.float32).tiny))
            count += 1
    norm = {"FULL": outer * inner, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return loss / max(1, norm)


@pytest.mark.parametrize("param,mode", [("", "VALID"), ("normalization: FULL", "FULL"),
                                        ("normalization: BATCH_SIZE", "BATCH_SIZE"),
                                        ("normalization: NONE", "NONE"), ("normalize: false", "BATCH_SIZE"),
                                        ("normalize: true", "VALID")])
def test_softmax_with_loss_normalizations(param, mode):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 4, 3)).astype(np.float32)
    lab = rng.integers(0, 4, size=(2, 3)).astype(np.float32)
    lab[0, 1] = 255
    layer = _layer(f'name: "loss" type: "SoftmaxWithLoss" bottom: "s" bottom: "l" top: "loss" top: "prob" '
                   f'loss_param {{ ignore_label: 255 {param} }}')
    loss, prob = layer(torch.tensor(x), torch.tensor(lab))
    assert float(loss) == pytest.approx(_softmax_loss_loop(x, lab, mode, ignore=255), rel=1e-5)
    assert torch.allclose(prob, torch.softmax(torch.tensor(x), 1))
    assert layer.loss_weights() == [1.0, 0.0]  # LossLayer's default: the first top only


def test_sigmoid_cross_entropy_and_euclidean_loss():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4)).astype(np.float32) * 3
    t = rng.integers(0, 2, size=(3, 4)).astype(np.float32)
    ref = -sum(x.flat[i] * (t.flat[i] - (x.flat[i] >= 0))
               - math.log(1 + math.exp(x.flat[i] - 2 * x.flat[i] * (x.flat[i] >= 0))) for i in range(x.size))
    sce = _layer('name: "s" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "l"')
    assert float(sce(torch.tensor(x), torch.tensor(t))) == pytest.approx(ref / 3, rel=1e-5)  # BATCH_SIZE
    valid = _layer('name: "s" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "l" '
                   'loss_param { normalization: VALID }')
    assert float(valid(torch.tensor(x), torch.tensor(t))) == pytest.approx(ref / 12, rel=1e-5)
    y = rng.normal(size=(3, 4)).astype(np.float32)
    eu = _layer('name: "e" type: "EuclideanLoss" bottom: "x" bottom: "y" top: "l" loss_weight: 0.5')
    assert float(eu(torch.tensor(x), torch.tensor(y))) == pytest.approx(((x - y) ** 2).sum() / 3 / 2, rel=1e-6)
    assert eu.loss_weights() == [0.5]


def test_head_runs_layers_in_order_on_graph_outputs_and_labels():
    layers = [text_format.Parse(t, pb.LayerParameter()) for t in (
        'name: "acc" type: "Accuracy" bottom: "fc" bottom: "label" top: "acc"',
        'name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" loss_weight: 2')]
    head = NetHead(layers)
    out = head.run({"fc": torch.tensor([[2.0, 1.0], [0.0, 3.0]]), "label": torch.tensor([0.0, 0.0])})
    assert float(out["acc"]) == 0.5
    assert head.loss_weights() == {"acc": 0.0, "loss": 2.0}
