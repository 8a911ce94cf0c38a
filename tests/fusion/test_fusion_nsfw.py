"""BN fusion on the real nsfw ResNet-50-1by2: all 53 Convolution+BatchNorm+Scale triples fold,
the fused net computes the same logits and probabilities (1e-5 relative), and the fused
model written with save_caffe runs in OpenCV's Caffe importer to the same probabilities."""
from __future__ import annotations

import pytest
import torch

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.caffe.netio import read_net, save_caffe
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import run_cv
from helpers.data import natural_images_bgr
from helpers.fusion import assert_rel


@pytest.fixture(scope="module")
def nsfw_fused(nsfw_model):
    gm = load_caffe(*nsfw_model)
    return gm, fuse_bn(gm, file=nsfw_model[0])


def _run(gm, x, device):
    """(logits of fc_nsfw, prob) — the logits through a hook, as softmax hides small errors."""
    gm = gm.to(device)
    seen = {}
    handle = layer_modules(gm)["fc_nsfw"].register_forward_hook(lambda m, i, o: seen.setdefault("fc", o))
    try:
        with torch.no_grad():
            out = gm(torch.from_numpy(x).to(device))
    finally:
        handle.remove()
    return seen["fc"].cpu().numpy(), out["prob"].cpu().numpy()


def test_nsfw_fuses_every_conv_bn_scale(nsfw_fused, nsfw_model):
    gm, res = nsfw_fused
    parsed = read_net(*nsfw_model)
    convs = [l.name for l in parsed.layers if l.type == "Convolution"]
    assert sorted(res.fused) == sorted(convs) and res.refused == {}
    by_name = {l.name: l for l in parsed.layers}
    for conv, (bn, sc) in res.fused.items():  # each conv absorbed the BN and Scale reading its blob
        assert by_name[bn].type == "BatchNorm" and by_name[sc].type == "Scale"
        assert by_name[bn].bottom[0] == by_name[conv].top[0]
    types = {m.caffe_type for m in layer_modules(res.graph).values()}
    assert "BatchNorm" not in types and "Scale" not in types


def test_nsfw_fused_matches_unfused(nsfw_fused, device):
    gm, res = nsfw_fused
    x = natural_images_bgr(count=2, seed=3)
    fc_ref, prob_ref = _run(gm, x, device)
    fc, prob = _run(res.graph, x, device)
    assert_rel(fc, fc_ref)
    assert_rel(prob, prob_ref)


def test_nsfw_fused_saved_runs_in_opencv(nsfw_fused, tmp_path):
    gm, res = nsfw_fused
    proto, weights = str(tmp_path / "fused.prototxt"), str(tmp_path / "fused.caffemodel")
    save_caffe(res.graph, proto, weights)
    x = natural_images_bgr(count=2, seed=4)
    _, prob_ref = _run(gm, x, "cpu")
    assert_rel(run_cv(proto, weights, {"data": x}, ["prob"])["prob"], prob_ref)
