"""The opt-in bias correction (``quantize(..., improve="bias_correction")``, CLI ``--improve``).

Checked against a plain re-implementation written here with ``torch.nn.functional`` on the
weights and record (the fake quantization and the ARQ grid of docs/algorithms.md): sequential per-channel corrections
E[float output] − E[quant output with upstream already corrected]. Then: the correction lowers
the output error on held-out data, it reaches the written fake-quant Caffe model's biases, the
default stays uncorrected, and bad values are user errors.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import amct_torch
from amct_torch import AmctError
from amct_torch.caffe.graph import layer_modules
from amct_torch.improve.bias_correction import correct_biases
from helpers.caffe_nets import rand
from helpers.improve_nets import conv_fc_net

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data(n: int, seed: int) -> np.ndarray:
    return rand(n, 3, 12, 12, seed=seed) + 0.5   # non-zero mean: weight errors shift the means


# -- the plain reference ------------------------------------------------------------------
def fq(x, scale, offset):
    return (torch.clamp(torch.round(x / scale) + offset, -128, 127) - offset) * scale


def wq(w, scale_w):
    s = torch.tensor(scale_w, dtype=torch.float64).reshape([-1] + [1] * (w.dim() - 1))
    return torch.clamp(torch.round(w / s), -128, 127) * s


def reference_corrections(params, records, x):
    """Sequential correction of conv1 → relu → conv2 → relu → fc in float64."""
    (w1, b1), (w2, b2), (w3, b3) = params
    r1, r2, r3 = records["conv1"], records["conv2"], records["fc"]

    def cm(y):  # per-channel mean
        return y.mean(dim=[0, 2, 3]) if y.dim() == 4 else y.mean(dim=0)

    def as4(d):
        return d.reshape(1, -1, 1, 1)

    y1 = F.conv2d(x, w1, b1)
    y2 = F.conv2d(F.relu(y1), w2, b2)
    y3 = F.linear(F.relu(y2).flatten(1), w3, b3)
    q1 = F.conv2d(fq(x, r1.scale_d, r1.offset_d), wq(w1, r1.scale_w), b1)
    d1 = cm(y1) - cm(q1)
    q1 = q1 + as4(d1)
    q2 = F.conv2d(fq(F.relu(q1), r2.scale_d, r2.offset_d), wq(w2, r2.scale_w), b2)
    d2 = cm(y2) - cm(q2)
    q2 = q2 + as4(d2)
    q3 = F.linear(fq(F.relu(q2), r3.scale_d, r3.offset_d).flatten(1), wq(w3, r3.scale_w), b3)
    d3 = cm(y3) - cm(q3)
    return {"conv1": d1, "conv2": d2, "fc": d3}


def calibrated(tmp_path, x, **kw):
    os.makedirs(tmp_path, exist_ok=True)
    proto, weights = conv_fc_net(tmp_path, convs=2, size=12)
    return amct_torch.quantize(proto, weights, x, output=str(tmp_path / "o" / "m"), batch_num=2,
                               save_type=None, report=False, quiet=True, device="cpu", **kw)


def test_corrections_equal_plain_sequential_reference(tmp_path, device):
    x = data(32, seed=7)
    r = calibrated(tmp_path, x)
    mods = layer_modules(r.float_model)
    params = [(mods[n].weight.detach().double(), mods[n].bias.detach().double())
              for n in ("conv1", "conv2", "fc")]
    want = reference_corrections(params, r.records, torch.from_numpy(x).double())
    fused = r.float_model.to(device)
    before = {n: mods[n].bias.detach().cpu().clone() for n in want}
    batches = [torch.from_numpy(x[:16]), torch.from_numpy(x[16:])]
    got = correct_biases(fused, r.records, batches, torch.device(device))
    assert set(got) == set(want)
    for n in want:
        assert torch.allclose(got[n].cpu(), want[n], atol=2e-4, rtol=1e-3), n
        assert want[n].abs().max() > 1e-3   # a correction that matters
        after = layer_modules(fused)[n].bias.detach().cpu()
        assert torch.allclose(after.double(), before[n].double() + want[n], atol=2e-4), n


def test_reduces_held_out_logit_error_on_example_model(tmp_path):
    """The bundled digits model, calibrated on its calibration split, scored on its held-out
    test split: SQNR of the last InnerProduct (the logits) against the float model."""
    from amct_torch.workflow.examples import example_data, example_model

    proto, weights = example_model()
    x, _ = example_data("calib")
    held = torch.from_numpy(example_data("test")[0])

    def sqnr(improve):
        r = amct_torch.quantize(proto, weights, x, output=str(tmp_path / str(improve) / "m"),
                                batch_num=4, save_type=None, report=False, quiet=True,
                                device="cpu", improve=improve)
        last = [n for n, m in layer_modules(r.float_model).items() if m.caffe_type == "InnerProduct"][-1]
        got = {}
        hooks = [layer_modules(m)[last].register_forward_hook(
            lambda _m, _a, o, k=k: got.__setitem__(k, o.detach().double()))
            for k, m in (("float", r.float_model), ("quant", r.quant_model))]
        with torch.no_grad():
            r.float_model(held)
            r.quant_model(held)
        for h in hooks:
            h.remove()
        ref, out = got["float"], got["quant"]
        return r.records, 10 * torch.log10((ref ** 2).sum() / ((out - ref) ** 2).sum()).item()

    base_records, base = sqnr(None)
    records, better = sqnr("bias_correction")
    assert records == base_records           # AMCT's factors are untouched
    assert better > base + 2.0, (base, better)


def test_correction_reaches_written_models(tmp_path):
    from amct_torch.caffe.netio import parse_caffemodel

    proto, weights = conv_fc_net(tmp_path, convs=2, size=12)
    x = data(64, seed=7) + 1.5  # a larger input mean: a larger mean output error to correct
    r = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "o" / "m"), batch_num=2,
                            save_type="Fakequant", report=False, quiet=True, device="cpu",
                            improve="bias_correction")
    assert r.improvement["kept"] == "bias_correction", r.improvement  # the guard keeps it here
    net = parse_caffemodel(r.files["fake_quant_weights"])
    written = {l.name: np.asarray(l.blobs[1].data, np.float32) for l in net.layer
               if l.name in ("conv1", "conv2", "fc")}
    fused = layer_modules(r.graph.fused)
    original = layer_modules(r.float_model)
    for n, b in written.items():
        np.testing.assert_allclose(b, fused[n].bias.detach().numpy(), rtol=0, atol=1e-7)
        assert np.abs(b - original[n].bias.detach().numpy()).max() > 1e-4


def test_unknown_improvement_is_a_user_error(tmp_path):
    with pytest.raises(AmctError, match="improve"):
        calibrated(tmp_path, data(8, seed=1), improve="magic")


def test_cli_improve_flag(tmp_path):
    proto, weights = conv_fc_net(tmp_path, convs=2, size=12)
    np.save(tmp_path / "calib.npy", data(16, seed=7))
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "amct_torch.cli", "calibrate", proto, weights,
           str(tmp_path / "calib.npy"), "-o", str(tmp_path / "out" / "m"), "--batch-num", "2",
           "--device", "cpu", "--quiet", "--save-type", "Fakequant"]
    ok = subprocess.run(cmd + ["--improve", "bias_correction"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert os.path.isfile(tmp_path / "out" / "m_fake_quant_model.prototxt")
    bad = subprocess.run(cmd + ["--improve", "magic"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
