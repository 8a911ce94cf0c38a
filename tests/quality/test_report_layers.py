"""The per-layer report: cosine and SQNR of each quantized layer's output (fake-quant vs
float), checked against numpy on outputs captured independently; the torch fake-quant model
used for it agrees with the exporters' fake-quant Caffe graph; worst layer first."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import amct_torch
from amct_torch.caffe.graph import layer_modules
from amct_torch.export import fake_quant_graph
from amct_torch.quality.report import format_table, layer_report, write_report
from amct_torch.workflow.examples import example_data, example_model
from helpers.exports import sqnr_db


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    proto, weights = example_model()
    x, _ = example_data("calib")
    out = tmp_path_factory.mktemp("rep") / "m"
    return amct_torch.quantize(proto, weights, x[:60], output=str(out), batch_num=2,
                               save_type=None, report=False, quiet=True)


def outputs(model, names, batches):
    got = {n: [] for n in names}
    mods = layer_modules(model)
    hs = [mods[n].register_forward_hook(lambda m, a, o, n=n: got[n].append(o.detach().double().numpy().ravel()))
          for n in names]
    with torch.no_grad():
        for b in batches:
            model(b)
    for h in hs:
        h.remove()
    return {n: np.concatenate(v) for n, v in got.items()}


def test_report_matches_numpy_on_captured_outputs(result, tmp_path, monkeypatch):
    import amct_torch.quality.report as report
    monkeypatch.setattr(report, "CHUNK_SAMPLES", 1000)  # whole batches, as captured below
    xt, _ = example_data("test")
    batches = [torch.from_numpy(xt[i:i + 50]) for i in (0, 50)]
    names = list(result.records)
    stats = layer_report(result.float_model, result.quant_model, batches, names)
    f = outputs(result.float_model, names, batches)
    q = outputs(result.quant_model, names, batches)
    for s in stats:
        a, b = f[s.layer], q[s.layer]
        cos = a @ b / np.sqrt((a @ a) * (b @ b))
        sqnr = sqnr_db(a, b)
        assert s.cosine == pytest.approx(cos, rel=1e-9) and s.sqnr_db == pytest.approx(sqnr, rel=1e-9)
        assert s.numel == a.size
    assert [s.cosine for s in stats] == sorted(s.cosine for s in stats)
    path = tmp_path / "r.json"
    write_report(str(path), stats, {"batches": 2})
    doc = json.load(open(path))
    assert [l["layer"] for l in doc["layers"]] == [s.layer for s in stats]
    assert stats[0].layer in format_table(stats).splitlines()[1]


def test_torch_fake_quant_model_equals_the_exporters_graph(result):
    xt, _ = example_data("test")
    x = torch.from_numpy(xt[:64])
    theirs = fake_quant_graph(result.float_model, result.records)
    with torch.no_grad():
        a = next(iter(result.quant_model(x).values()))
        b = next(iter(theirs(x).values()))
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_report_streams_layers_that_come_in_another_order(tmp_path):
    """Two branches listed in opposite orders in the two models: the lockstep report keeps the
    early output until the other model produces that layer, and the sums stay exact."""
    from helpers.caffe_nets import make_net, rand

    def body(order):
        layers = {
            "a": 'layer { name: "a" type: "Convolution" bottom: "x" top: "a" convolution_param { num_output: 4 kernel_size: 3 } }',
            "b": 'layer { name: "b" type: "Convolution" bottom: "x" top: "b" convolution_param { num_output: 4 kernel_size: 3 } }',
        }
        return "\n".join(layers[k] for k in order) + \
            '\nlayer { name: "r" type: "ReLU" bottom: "a" top: "a" }\nlayer { name: "s" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }'

    wa, wb = rand(4, 3, 3, 3, seed=1), rand(4, 3, 3, 3, seed=2)
    blobs = {"a": [wa, rand(4, seed=3)], "b": [wb, rand(4, seed=4)]}
    noisy = {"a": [wa + 0.05 * rand(4, 3, 3, 3, seed=5), blobs["a"][1]],
             "b": [wb + 0.05 * rand(4, 3, 3, 3, seed=6), blobs["b"][1]]}
    (tmp_path / "f").mkdir()
    (tmp_path / "q").mkdir()
    f = amct_torch.load_caffe(*make_net(tmp_path / "f", body("ab"), {"x": (2, 3, 8, 8)}, blobs))
    q = amct_torch.load_caffe(*make_net(tmp_path / "q", body("ba"), {"x": (2, 3, 8, 8)}, noisy))
    batches = [torch.from_numpy(rand(2, 3, 8, 8, seed=s)) for s in (7, 8)]
    stats = {s.layer: s for s in layer_report(f, q, batches, ["a", "b"])}
    fo, qo = outputs(f, ["a", "b"], batches), outputs(q, ["a", "b"], batches)
    for n in "ab":
        a, b = fo[n], qo[n]
        assert stats[n].cosine == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), rel=1e-9)
        assert stats[n].sqnr_db == pytest.approx(sqnr_db(a, b), rel=1e-9)


def test_large_batches_run_in_pieces_with_the_same_sums(result, monkeypatch):
    """A per-sample net's report batch runs through the lockstep in pieces (bounded memory);
    the sums are exact over the pieces (checked against outputs captured piece by piece: conv
    kernels may round differently at another batch size, so the pieces are the reference)."""
    import amct_torch.quality.report as report

    xt, _ = example_data("test")
    batches = [torch.from_numpy(xt[:50])]
    names = list(result.records)
    assert report._per_sample(result.float_model, result.quant_model)
    assert [p.shape[0] for p in report._chunks(batches[0], 16)] == [16, 16, 16, 2]
    monkeypatch.setattr(report, "CHUNK_SAMPLES", 16)
    stats = layer_report(result.float_model, result.quant_model, batches, names)
    pieces = report._chunks(batches[0], 16)
    f = outputs(result.float_model, names, pieces)
    q = outputs(result.quant_model, names, pieces)
    for s in stats:
        a, b = f[s.layer], q[s.layer]
        assert s.cosine == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), rel=1e-9)
        assert s.sqnr_db == pytest.approx(sqnr_db(a, b), rel=1e-9)
        assert s.numel == a.size


def test_nets_that_mix_samples_are_not_split(tmp_path):
    """Softmax over axis 0 couples the samples: such a net runs whole batches."""
    import amct_torch.quality.report as report
    from helpers.caffe_nets import make_net, rand

    body = ('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 1 } }\n'
            'layer { name: "s" type: "Softmax" bottom: "c" top: "s" softmax_param { axis: 0 } }')
    gm = amct_torch.load_caffe(*make_net(tmp_path, body, {"x": (4, 3, 2, 2)}, {"c": [rand(2, 3, 1, 1), rand(2)]}))
    assert not report._per_sample(gm)
    x = torch.zeros(20, 3, 2, 2)
    assert len(report._chunks(x, 8)) == 3 and report._chunks((x, torch.zeros(1, 3)), 8)[0][1].shape[0] == 1
