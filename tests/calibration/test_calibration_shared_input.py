"""Layers reading the same blob with the same activation config are calibrated once
(docs/config_and_record.md, "Quantizable layers"): one observer, fed once per batch, both layers
get its factors; a different config on one of them splits the group."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import amct_torch.calibration.observers as observers
from amct_torch import create_quant_config, init, quantize_model
from amct_torch.algorithms.ifmr import ifmr_exact
from amct_torch.record import read_record
from helpers.caffe_nets import make_net, rand

BODY = """
layer { name: "a" type: "Convolution" bottom: "data" top: "a"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "b" type: "Convolution" bottom: "data" top: "b"
        convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "ra" type: "ReLU" bottom: "a" top: "a" }
layer { name: "c" type: "Convolution" bottom: "a" top: "c"
        convolution_param { num_output: 2 kernel_size: 1 } }
"""


@pytest.fixture()
def net(tmp_path):
    blobs = {"a": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)],
             "b": [rand(2, 3, 1, 1, seed=3), rand(2, seed=4)],
             "c": [rand(2, 4, 1, 1, seed=5), rand(2, seed=6)]}
    return make_net(tmp_path, BODY, {"data": [1, 3, 8, 8]}, blobs)


def run(tmp_path, net, monkeypatch, cfg_text=""):
    made, updates = [], []
    real = observers.make_observer

    def counting(layer, cfg, ifmr_mode="streaming"):
        obs = real(layer, cfg, ifmr_mode=ifmr_mode)
        made.append(layer)
        orig = obs.update
        obs.update = lambda x, batch=None, layer=layer: (updates.append(layer), orig(x, batch))[1]
        return obs

    monkeypatch.setattr(observers, "make_observer", counting)
    proto, weights = net
    qcfg = tmp_path / "q.cfg"
    qcfg.write_text("batch_num: 2\n" + cfg_text)
    create_quant_config(str(tmp_path / "c.json"), proto, weights, config_defination=str(qcfg))
    graph = init(str(tmp_path / "c.json"), proto, weights, str(tmp_path / "r.txt"))
    model = quantize_model(graph, str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"),
                           ifmr_mode="exact")
    xs = [torch.from_numpy(rand(2, 3, 8, 8, seed=10 + i)) for i in range(2)]
    with torch.no_grad():
        for x in xs:
            model(x)
    return read_record(str(tmp_path / "r.txt")), made, updates, xs


def test_shared_input_calibrated_once(tmp_path, net, monkeypatch):
    rec, made, updates, xs = run(tmp_path, net, monkeypatch)
    assert sorted(made) == ["a", "c"]                 # b shares a's observer
    assert updates.count("a") == 2 and "b" not in updates
    assert (rec["a"].scale_d, rec["a"].offset_d) == (rec["b"].scale_d, rec["b"].offset_d)
    ref = ifmr_exact(torch.cat([x.reshape(-1) for x in xs]))
    assert rec["b"].scale_d == pytest.approx(ref.scale, rel=1e-6)
    assert rec["b"].offset_d == ref.offset
    assert (rec["b"].channels, rec["b"].height, rec["b"].width) == (3, 8, 8)


def test_different_config_on_one_reader_splits_the_group(tmp_path, net, monkeypatch):
    cfg = ('override_layer_configs { layer_name: "b" calibration_config { '
           'arq_quantize { channel_wise: true } ifmr_quantize { asymmetric: false } } }\n')
    rec, made, _, xs = run(tmp_path, net, monkeypatch, cfg)
    assert sorted(made) == ["a", "b", "c"]
    data = torch.cat([x.reshape(-1) for x in xs])
    assert rec["a"].scale_d == pytest.approx(ifmr_exact(data).scale, rel=1e-6)
    assert rec["b"].offset_d == 0
    assert rec["b"].scale_d == pytest.approx(ifmr_exact(data, asymmetric=False).scale, rel=1e-6)
    assert not np.isclose(rec["a"].scale_d, rec["b"].scale_d)
