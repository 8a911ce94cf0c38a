"""The guards of the refining pass (``improve/refine.py``): a change fitted on the fitting rows
is kept only where it lowers the layer's output error on the held-out rows. Cases are built so
that the fitting rows mislead: the change that wins there loses on the held-out rows, and must
be reverted; with held-out rows like the fitting ones the same change is kept (so the check can
fail)."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.algorithms.quant import fake_quant
from amct_torch.caffe import load_caffe
from amct_torch.improve.refine import MULTIPLIERS, refine
from amct_torch.record import LayerRecord
from helpers.caffe_nets import make_net, rand

BODY = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 1 } }
"""


def one_layer(tmp_path):
    w = rand(4, 3, 1, 1, seed=1)
    proto, model = make_net(tmp_path, BODY, {"data": [1, 3, 4, 4]}, {"conv": [w, np.zeros(4, np.float32)]})
    gm = load_caffe(proto, model)
    # weight factors that represent w exactly enough (per channel max/127), input range [-8, 8)
    sw = [float(v) for v in np.abs(w).reshape(4, -1).max(1) / 127]
    rec = {"conv": LayerRecord(scale_d=8 / 128, offset_d=0, scale_w=sw, offset_w=[0] * 4)}
    return gm, rec


def test_range_choice_reverted_when_it_loses_on_held_out(tmp_path):
    gm, rec = one_layer(tmp_path)
    small = torch.from_numpy(rand(16, 3, 4, 4, seed=2) * 0.5)   # |x| << 8: a tighter clip wins
    large = torch.from_numpy(np.sign(rand(8, 3, 4, 4, seed=3)) * 7.5)  # |x| = 7.5: clipping hurts
    res = refine(gm, rec, (torch.cat([small, large]),), 16, ranges=True, bias=False)
    ch = res.changes["conv"]
    assert ch.multiplier == 1.0 and res.records["conv"].scale_d == rec["conv"].scale_d
    # the same fitting rows with held-out rows like them: the tighter clip is kept
    res2 = refine(gm, rec, (torch.cat([small, small[:8] * 0.9]),), 16, ranges=True, bias=False)
    m = res2.changes["conv"].multiplier
    assert m < 1.0 and m in MULTIPLIERS
    assert res2.changes["conv"].range_db > 0
    # independent check of the kept choice: the held-out output MSE (plain conv2d, weights on
    # the ARQ grid with the record's scale_w) is lower with the chosen scale than with AMCT's
    w = gm.get_submodule("conv").weight.detach()
    s = torch.tensor(rec["conv"].scale_w).reshape(4, 1, 1, 1)
    wq = torch.clamp(torch.round(w / s), -128, 127) * s
    held = small[:8] * 0.9
    ref = torch.nn.functional.conv2d(held, w)

    def mse(scale):
        return float(((torch.nn.functional.conv2d(fake_quant(held, scale, 0), wq) - ref) ** 2).mean())

    assert mse(res2.records["conv"].scale_d) < mse(rec["conv"].scale_d)


def test_bias_correction_reverted_when_held_out_mean_differs(tmp_path):
    gm, rec = one_layer(tmp_path)
    # weights off their grid (a coarse scale_w): the quantized output has a mean error that
    # depends on the input's mean, which differs in sign between fitting and held-out rows
    rec["conv"] = LayerRecord(scale_d=8 / 128, offset_d=0, scale_w=[0.2] * 4, offset_w=[0] * 4)
    pos = torch.from_numpy(np.abs(rand(16, 3, 4, 4, seed=4)) + 1.0)
    neg = -pos[:8]
    res = refine(gm, rec, (torch.cat([pos, neg]),), 16, ranges=False, bias=True)
    ch = res.changes["conv"]
    assert not ch.bias_kept and "conv" not in res.bias_delta
    res2 = refine(gm, rec, (torch.cat([pos, pos[:8] * 1.1]),), 16, ranges=False, bias=True)
    assert res2.changes["conv"].bias_kept and res2.changes["conv"].bias_db > 0
    # the delta is float mean − quantized mean per channel on the fitting rows, computed plainly
    w = gm.get_submodule("conv").weight.detach()
    wq = torch.clamp(torch.round(w / 0.2), -128, 127) * 0.2
    y = torch.nn.functional.conv2d(pos, w)
    yq = torch.nn.functional.conv2d(fake_quant(pos, 8 / 128, 0), wq)
    want = (y.double().mean(dim=(0, 2, 3)) - yq.double().mean(dim=(0, 2, 3)))
    np.testing.assert_allclose(res2.bias_delta["conv"].numpy(), want.numpy(), rtol=1e-5, atol=1e-7)


def test_widening_only_candidates(tmp_path):
    """``multipliers=WIDER`` (the cross-fitted nets' set): never a clip tighter than AMCT's,
    even where a tighter one would win; a wider one where the inputs pass AMCT's clip."""
    import pytest

    from amct_torch.improve.refine import WIDER
    gm, rec = one_layer(tmp_path)
    small = torch.from_numpy(rand(24, 3, 4, 4, seed=2) * 0.5)   # a tighter clip wins (the test above)
    res = refine(gm, rec, (small,), 16, ranges=True, bias=False, multipliers=WIDER)
    assert res.changes["conv"].multiplier == 1.0
    # inputs up to ±11 against AMCT's clip [-8, 8): a wider clip lowers the output error
    wide = torch.from_numpy(np.clip(rand(24, 3, 4, 4, seed=5) * 6, -11, 11))
    res = refine(gm, rec, (wide,), 16, ranges=True, bias=False, multipliers=WIDER)
    m = res.changes["conv"].multiplier
    assert m > 1.0 and m in WIDER
    w = gm.get_submodule("conv").weight.detach()
    s = torch.tensor(rec["conv"].scale_w).reshape(4, 1, 1, 1)
    wq = torch.clamp(torch.round(w / s), -128, 127) * s
    held = wide[16:]
    ref = torch.nn.functional.conv2d(held, w)

    def mse(scale):
        return float(((torch.nn.functional.conv2d(fake_quant(held, scale, 0), wq) - ref) ** 2).mean())

    assert mse(res.records["conv"].scale_d) < mse(rec["conv"].scale_d)
    with pytest.raises(ValueError, match="1.0"):
        refine(gm, rec, (wide,), 16, ranges=True, bias=False, multipliers=(1.1, 1.2))
