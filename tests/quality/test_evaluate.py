"""``amct-torch evaluate``: the float, fake-quant and deploy models of a small net run on data
and are compared with the float model; SQNR and cosine are checked against numpy formulas
written here on the models' outputs."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.export import save_quant_models
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net
from helpers.exports import SMALL_BODY, minmax_records, small_blobs, sqnr_db


def _row(text: str, name: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(name + " "))


def test_evaluate_float_fakequant_deploy(tmp_path, capsys):
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3, 8, 8)).astype(np.float32)
    gm = fuse_bn(load_caffe(proto, model)).graph
    save_quant_models(gm, minmax_records(gm, torch.from_numpy(x)), save_path=str(tmp_path / "q"))
    np.save(tmp_path / "data.npy", x)
    ref = load_caffe(proto, model)(torch.from_numpy(x))["fc1"].detach().double().numpy()
    for kind in ("fake_quant", "deploy"):
        mp, wp = str(tmp_path / f"q_{kind}_model.prototxt"), str(tmp_path / f"q_{kind}_weights.caffemodel")
        assert main(["evaluate", mp, wp, str(tmp_path / "data.npy"), "--reference", proto, model,
                     "--batch-size", "4"]) == 0
        row = _row(capsys.readouterr().out, "fc1")
        with torch.no_grad():
            out = load_caffe(mp, wp)(torch.from_numpy(x))["fc1"].double().numpy()
        sqnr = sqnr_db(ref, out)
        cos = (out * ref).sum() / np.sqrt((out ** 2).sum() * (ref ** 2).sum())
        assert abs(float(row[-3]) - sqnr) < 0.01 and abs(float(row[-2]) - cos) < 1e-6, (kind, row, sqnr, cos)
        assert 10 < sqnr < 60
    assert main(["evaluate", proto, model, str(tmp_path / "data.npy"), "--reference", proto, model]) == 0
    row = _row(capsys.readouterr().out, "fc1")
    assert row[-3] == "inf" and float(row[-2]) == 1.0


def test_evaluate_bad_reference_exits_2(tmp_path, capsys):
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    np.save(tmp_path / "data.npy", np.zeros((2, 3, 8, 8), np.float32))
    assert main(["evaluate", proto, model, str(tmp_path / "data.npy"), "--reference", proto,
                 str(tmp_path / "missing.caffemodel")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.caffemodel" in err[0]
