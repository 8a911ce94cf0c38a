"""A record whose scale_w rounds every int8 weight of a layer, or of an output channel, to 0 is
refused naming the layer (as a scale_w outside the plausible range is); a channel whose float
weights are negligible (which calibration itself gives scale 1) stays allowed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.errors import RecordError
from amct_torch.export.layer_quant import NEGLIGIBLE_WEIGHT, check_not_zeroed


def _w() -> torch.Tensor:
    w = torch.from_numpy(np.random.default_rng(0).uniform(-0.2, 0.2, (4, 3, 3, 3)).astype(np.float32))
    w[:, 0, 0, 0] = 0.1  # every channel's largest |weight| is at least 0.1
    return w


def test_a_per_tensor_scale_zeroing_every_weight_is_refused():
    with pytest.raises(RecordError, match="every output channel") as err:
        check_not_zeroed("conv1", _w(), torch.tensor(1e6).reshape(1, 1, 1, 1), "Convolution", "r.txt")
    assert err.value.layer == "conv1" and err.value.file == "r.txt"


def test_one_channel_zeroed_is_refused_naming_it():
    s = torch.full((4, 1, 1, 1), 0.2 / 127)
    s[2] = 1.0  # 0.2 / 1.0 < 0.5: channel 2 all zeros
    with pytest.raises(RecordError, match="output channel 2"):
        check_not_zeroed("conv1", _w(), s, "Convolution")


def test_a_scale_that_keeps_one_code_is_accepted_and_a_dead_channel_too():
    w = _w()
    s = (w.flatten(1).abs().amax(1) / 0.51).reshape(4, 1, 1, 1)  # largest code: round(0.51) = 1
    check_not_zeroed("conv1", w, s, "Convolution")
    w[1] = NEGLIGIBLE_WEIGHT / 2  # a dead channel, given scale 1 by calibration
    s[1] = 1.0
    check_not_zeroed("conv1", w, s, "Convolution")
