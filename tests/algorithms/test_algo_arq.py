"""ARQ vs the check vector of docs/algorithms.md ("ARQ") and a per-channel loop reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.algorithms.arq import arq_quantize
from amct_torch.algorithms.quant import fake_quant


def ref_channel(v):
    mx, mn = float(v.max()), float(v.min())
    ext = mx if mx > -mn else mn
    s = np.float32(ext / 127) if ext > 0 else np.float32(-ext / 128)
    return np.float32(1.0) if s < 1.1920929e-07 else s


def ref_arq(w, layer_type, channel_wise, group):
    """Loop over output channels, picking the channel's elements by hand from the layout."""
    w = np.asarray(w, np.float32)
    if not channel_wise or layer_type == "InnerProduct":
        s = ref_channel(w)
        return np.array([s], np.float32), np.clip(np.round(w / s), -128, 127)
    if layer_type == "Convolution":
        scales = np.array([ref_channel(w[o]) for o in range(w.shape[0])], np.float32)
        q = np.stack([np.clip(np.round(w[o] / scales[o]), -128, 127) for o in range(w.shape[0])])
        return scales, q
    c_in, c_out_g = w.shape[0], w.shape[1]
    cig = c_in // group
    scales = []
    q = np.zeros_like(w)
    for g in range(group):
        for j in range(c_out_g):
            block = w[g * cig:(g + 1) * cig, j]
            s = ref_channel(block)
            scales.append(s)
            q[g * cig:(g + 1) * cig, j] = np.clip(np.round(block / s), -128, 127)
    return np.array(scales, np.float32), q


def test_spec_check_vector(device):
    w = torch.tensor([[-1.0] * 12, [0.0] * 12, [1.0] * 12, [-1.0, 0.0, 1.0] * 4], device=device).reshape(4, 3, 2, 2)
    r = arq_quantize(w, "Convolution", True)
    assert torch.allclose(r.scale_w.cpu(), torch.tensor([1 / 128, 1.0, 1 / 127, 1 / 128]))
    assert r.int8_weight.reshape(4, -1).tolist() == [[-128] * 12, [0] * 12, [127] * 12, [-128, 0, 127] * 4]
    assert r.int8_weight.dtype == torch.int8 and r.offset_w.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("layer_type,shape,group", [
    ("Convolution", (16, 3, 3, 3), 1), ("Convolution", (8, 2, 1, 1), 4),
    ("Deconvolution", (6, 4, 3, 3), 1), ("Deconvolution", (8, 3, 2, 2), 2), ("Deconvolution", (12, 1, 3, 3), 12),
    ("InnerProduct", (10, 37), 1)])
@pytest.mark.parametrize("channel_wise", [True, False])
def test_matches_reference(layer_type, shape, group, channel_wise, device):
    rng = np.random.default_rng(sum(shape) + group)
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 1, (shape[0],) + (1,) * (len(shape) - 1))).astype(np.float32)
    w[0] = 0.0  # a dead channel
    scales, q = ref_arq(w, layer_type, channel_wise, group)
    r = arq_quantize(torch.from_numpy(w).to(device), layer_type, channel_wise, group)
    np.testing.assert_allclose(r.scale_w.cpu().numpy(), scales, rtol=1e-6)
    assert np.array_equal(r.int8_weight.cpu().numpy(), q.astype(np.int8))
    assert r.int8_weight.shape == w.shape
    s_b = r.fake_quant_weight.cpu().numpy()
    if layer_type == "Convolution" and channel_wise:
        np.testing.assert_allclose(s_b, q * scales.reshape(-1, 1, 1, 1), rtol=1e-6)


def test_fake_quant_activation(device):
    x = torch.tensor([-3.0, -0.05, 0.0, 0.025, 0.075, 1.0, 9.0], device=device)
    y = fake_quant(x, 0.05, 10)
    # q = clamp(round(x/0.05) + 10, -128, 127) by hand: -50, 9, 10, 10 (0.5 → 0), 12 (1.5 → 2), 30, 127
    expect = (torch.tensor([-50, 9, 10, 10, 12, 30, 127.0]) - 10) * 0.05
    assert torch.allclose(y.cpu(), expect)
    assert fake_quant(x.half(), 0.05, 10).dtype == torch.float16
