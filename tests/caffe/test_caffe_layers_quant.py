"""AMCT Quant / DeQuant layers of our fake-quant models, with hand-worked numbers."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch import ModelError
from helpers.caffe_nets import make_net, run_ours


def _quant_net(tmp_path, scale: float, offset: int):
    off = "\\%03o" % (offset & 0xFF)
    body = (f'layer {{ name: "q" type: "Quant" bottom: "data" top: "q" quant_param {{ scale: {scale} offset: "{off}" }} }}\n'
            'layer { name: "dq" type: "DeQuant" bottom: "q" top: "dq" }')
    return make_net(tmp_path, body, {"data": (1, 6)})


def test_quant_dequant_hand_worked(tmp_path, device):
    """scale_d = 0.5 (quant_param.scale = 2), offset_d = -3: q = clamp(round(2x) - 3, -128, 127),
    y = (q + 3) / 2; round is half-to-even."""
    proto, model = _quant_net(tmp_path, 2.0, -3)
    x = np.array([[0.25, 0.75, -1.3, 100.0, -100.0, 1.0]], np.float32)
    y = run_ours(proto, model, x, device=device)["dq"]
    # round(2x) = 0, 2, -3, 200, -200, 2 -> q = -3, -1, -6, 127 (clamped), -128 (clamped), -1
    q = np.array([-3, -1, -6, 127, -128, -1], np.float32)
    np.testing.assert_array_equal(y[0], (q + 3) / 2)


def test_quant_bad_scale(tmp_path):
    proto, model = _quant_net(tmp_path, 0.0, 0)
    with pytest.raises(ModelError) as info:
        from amct_torch import load_caffe
        load_caffe(proto, model)
    assert info.value.layer == "q"
