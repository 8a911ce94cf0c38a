"""The deploy model amct_torch writes loads back and runs with integer semantics (int8 codes ×
int8 weights → exact int32 sums + int32 bias, × deq_scale): it equals the fake-quant model
except where a value sits on a rounding tie (the deploy bias is rounded to the accumulator
grid: ±½·scale_d·scale_w), checked on the SSD test net and on nsfw; it writes back byte for
byte; loaded models hold no parameter that requires grad and run without torch warnings."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.caffe.layers import QuantLayer
from amct_torch.caffe.netio import save_caffe
from amct_torch.export import save_quant_models
from amct_torch.export.layer_quant import plan_layers
from amct_torch.fusion import fuse_bn
from helpers.data import natural_images_bgr, nsfw_dir
from helpers.exports import minmax_records
from helpers.ssd import ssd_net


def _write(tmp_path, proto, model, x_calib):
    gm = fuse_bn(load_caffe(proto, model)).graph
    recs = minmax_records(gm, torch.from_numpy(x_calib))
    prefix = str(tmp_path / "q")
    save_quant_models(gm, recs, save_path=prefix)
    fq = load_caffe(prefix + "_fake_quant_model.prototxt", prefix + "_fake_quant_weights.caffemodel")
    dep = load_caffe(prefix + "_deploy_model.prototxt", prefix + "_deploy_weights.caffemodel")
    return gm, recs, fq, dep, prefix


def _capture(g, names, x):
    mods, out = layer_modules(g), {}
    hs = [mods[n].register_forward_hook(lambda m, i, y, n=n: out.__setitem__(n, y.detach().double().numpy().copy()))
          for n in names]
    with torch.no_grad():
        res = {k: v.double().numpy() for k, v in g(torch.from_numpy(x)).items()}
    for h in hs:
        h.remove()
    out.update(res)
    return out


@pytest.fixture(scope="module")
def ssd(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ssd_deploy")
    proto, model = ssd_net(tmp)
    return _write(tmp, proto, model, natural_images_bgr(size=64, count=4, seed=1) / 64.0)


def test_ssd_deploy_matches_fake_quant(ssd):
    gm, recs, fq, dep, _ = ssd
    mods = layer_modules(dep)
    assert mods["conv1"].integer and mods["h2_loc"].integer and mods["conv1_dequant_layer"].deq_scale is not None
    x = natural_images_bgr(size=64, count=3, seed=7) / 64.0
    quants = [n for n, m in mods.items() if isinstance(m, QuantLayer)]
    assert all(mods[n].emit_codes for n in quants)
    names = quants + ["conv1_dequant_layer", "mbox_loc", "mbox_conf_flatten"]
    a, b = _capture(dep, names, x), _capture(fq, names, x)
    for n in quants:  # codes: deploy emits q - offset; the fake-quant file model (q - offset)/scale
        diff = a[n] - np.rint(b[n] * mods[n].scale)
        assert np.abs(diff).max() <= 1 and (diff != 0).mean() <= 0.03, (n, (diff != 0).mean())
    # first layer: the same codes in, so only the bias rounding (≤ ½ accumulator step) differs
    step = plan_layers(gm, recs)["conv1"].deq_scale.reshape(1, -1, 1, 1)
    assert (np.abs(a["conv1_dequant_layer"] - b["conv1_dequant_layer"]) / step).max() <= 0.5 + 1e-3
    last = min(recs[n].scale_d for n in ("h1_loc", "h2_loc", "h1_conf", "h2_conf"))
    for k in ("mbox_loc", "mbox_conf_flatten"):
        within = np.abs(a[k] - b[k]) <= last  # one quantization step of the last layers
        assert within.mean() >= 0.999, (k, within.mean())


def test_ssd_deploy_writes_back_byte_for_byte(ssd, tmp_path):
    *_, dep, prefix = ssd
    save_caffe(dep, str(tmp_path / "again.prototxt"), str(tmp_path / "again.caffemodel"))
    again = load_caffe(str(tmp_path / "again.prototxt"), str(tmp_path / "again.caffemodel"))
    for n, m in layer_modules(dep).items():
        for u, v in zip(m.caffe_blobs(), layer_modules(again)[n].caffe_blobs()):
            assert u.dtype == v.dtype and np.array_equal(u, v), n
    blobs = layer_modules(again)["conv1"].caffe_blobs()
    assert blobs[0].dtype == np.int8 and layer_modules(again)["h1_loc"].caffe_blobs()[1].dtype == np.int32


def test_nsfw_deploy_matches_fake_quant(tmp_path):
    d = nsfw_dir()
    gm, recs, fq, dep, _ = _write(tmp_path, os.path.join(d, "deploy.prototxt"),
                                  os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"),
                                  natural_images_bgr(count=4, seed=1))
    x = natural_images_bgr(count=4, seed=3)
    a, b = _capture(dep, [], x), _capture(fq, [], x)
    within = np.abs(a["prob"] - b["prob"]) <= recs["fc_nsfw"].scale_d
    assert within.mean() >= 0.999
    assert np.array_equal(a["prob"].argmax(1), b["prob"].argmax(1))


def test_loaded_models_need_no_grad_and_do_not_warn(ssd):
    *_, dep, prefix = ssd
    for g in (load_caffe(prefix + "_fake_quant_model.prototxt", prefix + "_fake_quant_weights.caffemodel"), dep):
        assert not any(p.requires_grad for p in g.parameters())
    float_gm = ssd[0]
    assert not any(p.requires_grad for p in float_gm.parameters())
    x = torch.from_numpy(natural_images_bgr(size=64, count=2, seed=5) / 64.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        float_gm(x)  # outside no_grad, as a user would
        dep(x)
