"""Learned weight rounding (``improve/adaround.py``, ``--improve adaround``).

Checked against references written here: a brute-force search over every floor/ceil choice of a
tiny layer, ``F.conv2d``/``F.linear`` for the patch gatherer, the exporters' own ARQ-grid
quantization (``layer_quant``) for the stored weights, and the written deploy Caffe model and
QDQ ONNX for the end-to-end job; the pass never reads a value back (meta device)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper

import amct_torch
from amct_torch.caffe import load_caffe
from amct_torch.caffe.graph import layer_modules
from amct_torch.export.layer_quant import layer_quant
from amct_torch.improve import adaround as A
from amct_torch.record import LayerRecord
from amct_torch.workflow.examples import example_data, example_model
from helpers.caffe_nets import make_net, rand


def _problem(seed: int, o: int, k: int, p: int, coarse: float = 6.0):
    """A layer [1, o, k] on a coarse grid (the weight error dominates the output error),
    positive inputs, fitting and held-out rows from the same distribution."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1, o, k, generator=g)
    s = w.abs().amax(-1, keepdim=True) / 127 * coarse
    x = torch.rand(2 * p, 1, k, generator=g) + 0.2
    y = torch.einsum("pgk,gok->pgo", x, w).reshape(2 * p, o)
    return w, s, x[:p], y[:p], x[p:], y[p:]


def _sse(x, codes, s, y):
    return float(((torch.einsum("pgk,gok->pgo", x.double(), (codes * s).double()).reshape(y.shape)
                   - y.double()) ** 2).sum())


def test_learned_rounding_close_to_brute_force_optimum():
    """Tiny layers (2 outputs x 5 inputs: 1024 floor/ceil choices each): the learned codes are
    floor or ceil of w/s and get at least 80 % (in dB, less 0.1 dB) of the gain of the best choice found by
    trying them all, scored on the fitting rows; where that gain is real they are kept (they
    also win on the held-out rows), and the reported held-out errors are the plain MSEs."""
    real = 0
    for seed in range(4):
        w, s, xf, yf, xh, yh = _problem(seed, 2, 5, 64)
        ws = w / s
        lo = torch.floor(ws)
        best = math.inf
        for bits in itertools.product((0.0, 1.0), repeat=ws.numel()):
            codes = (lo + torch.tensor(bits).reshape(ws.shape)).clamp(-128, 127)
            best = min(best, _sse(xf, codes, s, yf))
        near = torch.round(ws)
        r = A.learn_rounding(w, s, xf, yf, xh, yh, iters=300)
        assert bool(((r.codes == lo) | (r.codes == lo + 1)).all())
        learned = A.learn_rounding(w, s, xf, yf, xf, yf, iters=300).codes   # held = fit: unguarded
        e_near, e_learn = _sse(xf, near, s, yf), _sse(xf, learned, s, yf)
        gain, best_gain = 10 * math.log10(e_near / e_learn), 10 * math.log10(e_near / best)
        assert gain >= 0.8 * best_gain - 0.1, (seed, gain, best_gain)
        if best_gain > 1.0:
            real += 1
            assert bool(r.kept) and not torch.equal(r.codes, near)
        count = yh.numel()
        np.testing.assert_allclose(
            r.err.tolist(), [_sse(xh, near, s, yh) / count, min(_sse(xh, near, s, yh), _sse(xh, learned, s, yh)) / count],
            rtol=1e-4)
    assert real >= 1   # the check can fail: some seed has a real gain to find


def test_guard_keeps_nearest_when_held_out_rows_disagree():
    """Fitted on rows where only the first inputs are active, held out on rows where only the
    others are: what the learned codes change cannot help there, so ARQ's codes stay; with
    held-out rows like the fitting ones the learned codes are kept (so the check can fail)."""
    w, s, xf, yf, _, _ = _problem(1, 4, 12, 128)
    mask = torch.zeros(12)
    mask[:6] = 1
    xf = xf * mask
    yf = torch.einsum("pgk,gok->pgo", xf, w).reshape(yf.shape)
    xh = torch.rand(64, 1, 12, generator=torch.Generator().manual_seed(5)) * (1 - mask)
    yh = torch.einsum("pgk,gok->pgo", xh, w).reshape(64, 4)
    near = torch.round(w / s)
    r = A.learn_rounding(w, s, xf, yf, xh, yh, iters=200)
    # the held-out rows are zero wherever the learned codes may differ: no held-out gain, so kept off
    assert not bool(r.kept) and torch.equal(r.codes, near)
    r2 = A.learn_rounding(w, s, xf, yf, xf[:64] * 1.01, yf[:64] * 1.01, iters=200)
    assert bool(r2.kept) and not torch.equal(r2.codes, near)


def test_codes_stay_on_the_grid_extremes_and_dead_channels_fixed():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1, 6, 20, generator=g)
    w[0, 5] = 0.0                                     # a dead channel (ARQ's scale 1, codes 0)
    w[0, 4] = torch.rand(20, generator=g) * 1e-9      # tiny: its share of the output error negligible
    amax = w.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax)) * 1.0
    x = torch.rand(256, 1, 20, generator=g)
    y = torch.einsum("pgk,gok->pgo", x, w).reshape(256, 6) + 0.3   # a target the grid cannot hit
    r = A.learn_rounding(w, s, x[:128], y[:128], x[128:], y[128:], iters=100)
    near = torch.clamp(torch.round(w / s), -128, 127)
    assert bool(r.kept) and not torch.equal(r.codes, near)   # learned codes kept: the checks below bite
    assert bool(((r.codes >= -128) & (r.codes <= 127)).all())
    assert bool(((r.codes - w / s).abs() < 1).all())
    ext = near.abs() >= 127
    assert bool(ext.any()) and torch.equal(r.codes[ext], near[ext])
    assert torch.equal(r.codes[0, 4:], near[0, 4:])


@pytest.mark.parametrize("cfg", [
    dict(c_in=3, c_out=4, k=3, stride=1, pad=1, dil=1, groups=1),
    dict(c_in=4, c_out=6, k=3, stride=2, pad=0, dil=2, groups=2),
    dict(c_in=5, c_out=5, k=3, stride=2, pad=1, dil=1, groups=5),   # depthwise
    dict(c_in=3, c_out=2, k=1, stride=1, pad=0, dil=1, groups=1),
])
def test_patches_times_weights_are_the_convolution(cfg):
    g = torch.Generator().manual_seed(7)
    conv = torch.nn.Conv2d(cfg["c_in"], cfg["c_out"], cfg["k"], cfg["stride"], cfg["pad"], cfg["dil"],
                           cfg["groups"], bias=True)
    conv.caffe_type = "Convolution"
    x = torch.randn(3, cfg["c_in"], 9, 8, generator=g)
    with torch.no_grad():
        y = F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)
    total = y.shape[0] * y.shape[2] * y.shape[3]
    idx = torch.randperm(total, generator=g)[:40]
    with torch.no_grad():
        p = A.patches(conv, x, idx)
        got = torch.einsum("pgk,gok->pgo", p, A.weight_view(conv)).reshape(idx.numel(), -1)
        want = A.outputs_at(conv, y, idx)   # bias taken off
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    # the positions are (row, y, x) in row-major order
    n, r = int(idx[0]) // (y.shape[2] * y.shape[3]), int(idx[0]) % (y.shape[2] * y.shape[3])
    np.testing.assert_allclose(want[0].numpy(), (y[n, :, r // y.shape[3], r % y.shape[3]] - conv.bias).detach().numpy(),
                               rtol=1e-6)


def test_patches_of_inner_product():
    fc = torch.nn.Linear(24, 5)
    fc.caffe_type, fc.axis = "InnerProduct", 1
    x = torch.randn(7, 2, 3, 4)
    idx = torch.tensor([0, 3, 6])
    with torch.no_grad():
        y = F.linear(x.flatten(1), fc.weight, fc.bias)
        got = torch.einsum("pgk,gok->pgo", A.patches(fc, x, idx), A.weight_view(fc)).reshape(3, 5)
        np.testing.assert_allclose(got.numpy(), A.outputs_at(fc, y, idx).numpy(), rtol=1e-5, atol=1e-6)


BODY = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 6 kernel_size: 3 group: 2 } }
layer { name: "dw" type: "ConvolutionDepthwise" bottom: "conv" top: "dw" convolution_param { num_output: 6 kernel_size: 3 } }
layer { name: "fc" type: "InnerProduct" bottom: "dw" top: "fc" inner_product_param { num_output: 3 } }
"""


def test_stored_weights_give_the_learned_codes_back_through_the_exporters(tmp_path):
    """codes · scale_w stored as the float weights: the exporters' quantization with the
    record's scale_w (``layer_quant``: the int8 of the deploy model and the QDQ ONNX, the
    fake-quant weights) gives exactly the codes, for random codes over the whole grid and
    scales over many magnitudes (grouped, depthwise, and per-tensor InnerProduct)."""
    blobs = {"conv": [rand(6, 2, 3, 3, seed=1), rand(6, seed=2)], "dw": [rand(6, 1, 3, 3, seed=3), rand(6, seed=4)],
             "fc": [rand(3, 6 * 4 * 4, seed=5), rand(3, seed=6)]}
    proto, model = make_net(tmp_path, BODY, {"data": [1, 4, 8, 8]}, blobs)
    gm = load_caffe(proto, model)
    rng = np.random.default_rng(0)
    for name, mod in layer_modules(gm).items():
        mod.bias.data.zero_()   # the int32 bias of tiny scales is not what this checks
        groups = mod.groups if name != "fc" else 1
        c = mod.weight.shape[0] if name != "fc" else 1
        for trial in range(20):
            sw = (10.0 ** rng.uniform(-12, 3, c)).astype(np.float32)
            codes = torch.from_numpy(rng.integers(-128, 128, tuple(mod.weight.shape)).astype(np.float32))
            g_view = codes.reshape(groups, -1, codes[0].numel()) if name != "fc" else codes.reshape(1, 3, -1)
            mod.weight.data = A.fake_weight(mod, g_view, sw.tolist())
            rec = LayerRecord(scale_d=0.1, offset_d=0, scale_w=sw.tolist(), offset_w=[0] * c)
            lq = layer_quant(name, mod, rec)
            assert np.array_equal(lq.int8_weight.astype(np.float32), codes.numpy()), (name, trial)
            assert np.array_equal(lq.fake_weight, mod.weight.detach().numpy())


def test_learning_never_reads_back():
    """The whole per-layer learning (patches, outputs, iterations, guard) runs on the meta
    device, where any host read raises."""
    conv = torch.nn.Conv2d(4, 6, 3, 1, 1, groups=2).to("meta")
    conv.caffe_type = "Convolution"
    x = torch.empty(6, 4, 8, 8, device="meta")
    y = torch.empty(6, 6, 8, 8, device="meta")
    fit, held = torch.arange(200, device="meta"), torch.arange(256, 384, device="meta")
    w = A.weight_view(conv)
    s = torch.empty(2, 3, 1, device="meta")
    for centered in (False, True):
        r = A.learn_rounding(w, s, A.patches(conv, x, fit), A.outputs_at(conv, y, fit),
                             A.patches(conv, x, held), A.outputs_at(conv, y, held), iters=5, centered=centered)
        assert r.codes.shape == w.shape and r.codes.device.type == "meta"
    # the direct path (K larger than the positions)
    r = A.learn_rounding(w, s, A.patches(conv, x, fit[:10]), A.outputs_at(conv, y, fit[:10]),
                         A.patches(conv, x, held), A.outputs_at(conv, y, held), iters=5)
    assert r.codes.device.type == "meta"


def test_refining_hook_never_reads_back():
    """A learned layer's step of the refining pass (``refine._pre_hook``: the range search at
    the sampled positions, then the learned rounding on the input so quantized) on the meta
    device: no host read before the pass's end (``refine._collect``)."""
    from amct_torch.improve import refine as R
    fconv = torch.nn.Conv2d(4, 6, 3, 1, 1, groups=2).to("meta")
    fconv.caffe_type = "Convolution"
    qconv = torch.nn.Conv2d(4, 6, 3, 1, 1, groups=2).to("meta")
    qconv.caffe_type = "Convolution"
    x = torch.empty(12, 4, 8, 8, device="meta")
    y = torch.empty(12, 6, 8, 8, device="meta")
    sites = A.choose_sites("conv", fconv, 12, A.input_positions_per_row(fconv, x), 8, x.device)
    sites.y_fit, sites.y_held = A.outputs_at(fconv, y, sites.fit), A.outputs_at(fconv, y, sites.held)
    for centered in (False, True):
        st = R._State()
        learner = R._Learner(fconv, [0.01] * 6, sites, 8, centered)
        hook = R._pre_hook("conv", 0.05, 0, False, fconv, 8, st, centered=centered, learner=learner)
        out = hook(qconv, (x,))
        assert out[0].shape == x.shape and out[0].device.type == "meta"
        assert st.chosen["conv"].device.type == "meta" and st.rmse["conv"].device.type == "meta"
        rounding, fw = st.rounding["conv"]   # learned (the layer's budget is above MIN_ITERS)
        assert rounding.kept.device.type == "meta" and fw.shape == qconv.weight.shape


def test_iteration_budget_scales_with_the_layer():
    # a cheap layer (many positions, short patches) gets the most; a costly one (long patches
    # over few positions) none
    assert A.iterations(16 * 32 * 32, 27, 16, 4096, True) == A.MAX_ITERS
    assert A.iterations(16 * 7 * 7, 2304, 256, 784, False) == 0
    rows_positions = int((A.MIN_ITERS + A.MAX_ITERS) / 2 * 576 / A.BUDGET)   # Gram: K² per iteration
    mid = A.iterations(rows_positions, 576, 64, 4096, True)
    assert A.MIN_ITERS < mid == int(A.BUDGET * rows_positions / 576) < A.MAX_ITERS


def test_job_writes_the_learned_codes(tmp_path, monkeypatch):
    """quantize(improve="adaround") on the example model, the stage kept (the end-of-run guard,
    tested elsewhere, forced to accept it): the record's scale_w is AMCT's; the deploy Caffe
    model and the QDQ ONNX hold the learned codes (different from ARQ's nearest rounding of the
    float weights somewhere), the fake-quant model their dequantized values."""
    from amct_torch.improve import pipeline
    monkeypatch.setattr(pipeline, "_choose", lambda stages: stages[-1])  # kept whatever it measured

    from amct_torch.caffe.netio import read_net
    calib, _ = example_data("calib")
    base = amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "d"), batch_num=3, device="cpu",
                               quiet=True, report=False, save_type=None)
    res = amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "a"), batch_num=3, device="cpu",
                              quiet=True, report=False, onnx=True, save_type="Both", improve="adaround")
    assert res.improvement["kept"] == "adaround"
    kept = [n for n, c in res.improvement["layers"].items() if c["rounding_kept"]]
    assert kept, res.improvement
    deploy = read_net(res.files["deploy_model"], res.files["deploy_weights"]).blobs
    fake = read_net(res.files["fake_quant_model"], res.files["fake_quant_weights"]).blobs
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(res.files["onnx"]).graph.initializer}
    float_mods = layer_modules(base.float_model)
    changed = 0
    for name in kept:
        assert res.records[name].scale_w == base.records[name].scale_w
        mod = layer_modules(res.graph.fused)[name]
        sw = np.asarray(res.records[name].scale_w, np.float32)
        s = sw.reshape([-1] + [1] * (mod.weight.dim() - 1))
        codes = np.clip(np.rint(mod.weight.detach().numpy() / s), -128, 127)
        assert np.array_equal(codes * s, mod.weight.detach().numpy())   # stored exactly on the grid
        assert np.array_equal(deploy[name][0].reshape(codes.shape), codes)
        np.testing.assert_array_equal(fake[name][0].reshape(codes.shape), (codes * s).astype(np.float32))
        # the QDQ ONNX holds the codes as int8, or shifted by 128 as uint8 (with a zero point
        # of 128), or transposed (an InnerProduct's weight as MatMul's right operand)
        held = [v.astype(np.int64) - (128 if v.dtype == np.uint8 else 0) for v in inits.values()
                if v.dtype in (np.int8, np.uint8) and v.size == codes.size]
        assert any(np.array_equal(v.reshape(codes.shape), codes) or
                   (v.ndim == 2 and np.array_equal(v.T.reshape(codes.shape), codes)) for v in held), name
        nearest = np.clip(np.rint(float_mods[name].weight.detach().numpy() / s), -128, 127)
        assert np.abs(codes - nearest).max() <= 1
        changed += int((codes != nearest).sum())
    assert changed > 0
