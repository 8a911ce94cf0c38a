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


def _images(folder, n: int, h: int = 14, w: int = 12) -> list[str]:
    import cv2
    folder.mkdir()
    rng = np.random.default_rng(5)
    paths = []
    for i in range(n):
        p = str(folder / f"im{i}.png")
        cv2.imwrite(p, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        paths.append(p)
    return paths


def test_evaluate_takes_calibrates_preprocessing_in_batches(tmp_path, capsys):
    # the deploy model against the float one on images, preprocessed as calibrate would; the
    # expected figures from inputs prepared here with OpenCV and the documented order
    import cv2
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    paths = _images(tmp_path / "imgs", 5)
    xs = []
    for p in paths:
        img = cv2.resize(cv2.imread(p, cv2.IMREAD_COLOR), (10, 10), interpolation=cv2.INTER_LINEAR)
        img = img[1:9, 1:9, ::-1].astype(np.float32)  # centre 8x8, RGB
        xs.append(((img - np.array([10, 20, 30], np.float32)) * 0.5).transpose(2, 0, 1))
    x = torch.from_numpy(np.stack(xs))
    gm = fuse_bn(load_caffe(proto, model)).graph
    save_quant_models(gm, minmax_records(gm, x), save_path=str(tmp_path / "q"))
    mp, wp = str(tmp_path / "q_deploy_model.prototxt"), str(tmp_path / "q_deploy_weights.caffemodel")
    with torch.no_grad():
        ref = load_caffe(proto, model)(x)["fc1"].double().numpy()
        out = load_caffe(mp, wp)(x)["fc1"].double().numpy()
    args = ["evaluate", mp, wp, str(tmp_path / "imgs"), "--reference", proto, model, "--device", "cpu",
            "--resize", "10,10", "--crop", "8", "--mean", "10,20,30", "--scale", "0.5", "--channel-order", "rgb"]
    assert main(args) == 0
    row = _row(capsys.readouterr().out, "fc1")
    assert row[1:3] == ["[5,", "5]"]  # the default batch holds all five images
    assert abs(float(row[-3]) - sqnr_db(ref, out)) < 0.01
    assert main(args + ["--batch-size", "2"]) == 0
    row2 = _row(capsys.readouterr().out, "fc1")
    assert row2[1:3] == ["[2,", "5]"] and abs(float(row2[-3]) - float(row[-3])) < 0.01


def test_evaluate_user_errors_are_one_line_before_any_forward(tmp_path, capsys, monkeypatch):
    from amct_torch.caffe import graph as caffe_graph
    conv = 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 } }\n'
    blobs = {"c": [np.ones((2, 3, 3, 3), np.float32), np.zeros(2, np.float32)]}
    proto, model = make_net(tmp_path, conv, {"data": [1, 3, 8, 8]}, blobs)
    (tmp_path / "r").mkdir()
    rproto, rmodel = make_net(tmp_path / "r", conv, {"data": [1, 3, 10, 10]}, blobs)
    np.save(tmp_path / "data.npy", np.zeros((2, 3, 8, 8), np.float32))
    forwards = []
    monkeypatch.setattr(caffe_graph.CaffeGraphModule, "__call__",
                        lambda self, *a, **k: forwards.append(1) or torch.nn.Module.__call__(self, *a, **k))
    data = str(tmp_path / "data.npy")
    cases = [(["--device", "foo"], "foo"), (["--reference", rproto, rmodel], rproto),
             (["--batch-size", "0"], "--batch-size")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "CUDA is not available"))
    for extra, named in cases:
        code = None
        try:
            code = main(["evaluate", proto, model, data, "-q", *extra])
        except SystemExit as stop:  # argparse's own refusal
            code = stop.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and named in err[0], (extra, err)
    assert forwards == []


def test_evaluate_says_how_many_samples_the_figures_cover(tmp_path, capsys):
    # five images written here, batches of two: 5 samples in ceil(5 / 2) = 3 batches, though
    # the shape column shows one batch's
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    _images(tmp_path / "imgs", 5)
    args = ["evaluate", proto, model, str(tmp_path / "imgs"), "--reference", proto, model, "--device", "cpu",
            "--batch-size", "2", "-q"]
    assert main(args) == 0
    assert "over 5 sample(s) in 3 batch(es)" in capsys.readouterr().err
    assert main(args + ["--max-batches", "2"]) == 0
    assert "over 4 sample(s) in 2 batch(es)" in capsys.readouterr().err
