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
from amct_torch.examples import example_data, example_model
from amct_torch.export import fake_quant_graph
from amct_torch.report import format_table, layer_report, write_report


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


def test_report_matches_numpy_on_captured_outputs(result, tmp_path):
    xt, _ = example_data("test")
    batches = [torch.from_numpy(xt[i:i + 50]) for i in (0, 50)]
    names = list(result.records)
    stats = layer_report(result.float_model, result.quant_model, batches, names)
    f = outputs(result.float_model, names, batches)
    q = outputs(result.quant_model, names, batches)
    for s in stats:
        a, b = f[s.layer], q[s.layer]
        cos = a @ b / np.sqrt((a @ a) * (b @ b))
        sqnr = 10 * np.log10((a @ a) / ((b - a) @ (b - a)))
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
