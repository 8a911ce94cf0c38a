"""``amct-torch test`` (caffe test without Caffe) on the real BVLC train/test prototxts: the
float numbers against a plain torch computation of the same net on the same LMDB records and
transform, the int8 ONNX numbers against ONNX Runtime run on the exported model by hand."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from amct_torch.caffe.netio import read_net
from amct_torch.cli import main
from amct_torch.errors import DataError
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.quality.net_scores import caffe_test
from helpers.caffe_dbs import write_mean
from helpers.train_nets import (
    CIFAR10_QUICK_TRAIN_TEST,
    IMAGENET_STYLE_TRAIN_VAL,
    LENET_TRAIN_TEST,
    digits_lmdb,
    random_weights,
    write_records,
)

pytest.importorskip("lmdb")


def _lenet(tmp_path, count=250):
    d = tmp_path / "lenet"
    d.mkdir()
    (d / "lenet_train_test.prototxt").write_text(LENET_TRAIN_TEST)
    images, labels = digits_lmdb(str(d / "examples/mnist/mnist_test_lmdb"), count)
    random_weights(str(d / "lenet_train_test.prototxt"), str(d / "lenet.caffemodel"), std=0.05)
    return str(d / "lenet_train_test.prototxt"), str(d / "lenet.caffemodel"), images, labels


def _blobs(weights):
    net = pb.NetParameter()
    with open(weights, "rb") as f:
        net.ParseFromString(f.read())
    return {l.name: [torch.tensor(np.asarray(b.data, np.float32).reshape(list(b.shape.dim))) for b in l.blobs]
            for l in net.layer if l.blobs}


def _lenet_plain(x, w):
    """LeNet's TEST forward written out: conv 5x5 (20), max 2/2, conv 5x5 (50), max 2/2,
    ip 500, relu, ip 10."""
    x = F.conv2d(x, *w["conv1"])
    x = F.max_pool2d(x, 2, 2)
    x = F.conv2d(x, *w["conv2"])
    x = F.max_pool2d(x, 2, 2)
    x = F.relu(F.linear(x.flatten(1), *w["ip1"]))
    return F.linear(x, *w["ip2"])


def _net_with_records(tmp_path, name, prototxt, text, lmdb, seed, shape):
    """A folder holding the prototxt and its TEST LMDB of random uint8 images, labels 0-9."""
    d = tmp_path / name
    d.mkdir()
    (d / prototxt).write_text(text)
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=shape, dtype=np.uint8)
    labels = rng.integers(0, 10, size=shape[0])
    write_records(str(d / lmdb), images, labels)
    return d, rng, images, labels


def _label_ranks(scores, labels):
    """How many classes score at least the true one's, less itself: Accuracy's top_k test."""
    return (scores >= scores.gather(1, labels[:, None])).sum(1) - 1


def _caffe_means(per_iteration):
    """caffe test's averaging: float32 sums over the iterations, divided in float32."""
    total = np.float32(0)
    for v in per_iteration:
        total = np.float32(total + np.float32(v))
    return float(np.float32(total / np.float32(len(per_iteration))))


def test_lenet_train_test_reads_the_test_phase(tmp_path):
    model, weights, _, _ = _lenet(tmp_path)
    parsed = read_net(model, weights)
    assert [l.name for l in parsed.data_layers] == ["mnist"]
    assert parsed.data_layers[0].data_param.batch_size == 100  # the TEST layer, not TRAIN's 64
    assert [l.name for l in parsed.layers] == ["conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2",
                                               "accuracy", "loss"]
    assert parsed.inputs == [("data", [100, 1, 28, 28]), ("label", [100])]
    from amct_torch.caffe.graph import load_caffe
    gm = load_caffe(model, weights)
    assert [n for n, _ in gm.caffe_inputs] == ["data"]  # the label feeds only the head
    assert [l.name for l in gm.meta["caffe_head"]] == ["accuracy", "loss"]
    types = {n.meta.get("caffe_type") for n in gm.graph.nodes}
    assert not types & {"Data", "Accuracy", "SoftmaxWithLoss"}
    assert list(gm(torch.zeros(2, 1, 28, 28))) == ["ip2"]


def test_inspect_train_val_is_supported(tmp_path, capsys):
    model, weights, _, _ = _lenet(tmp_path)
    assert main(["inspect", model, weights, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["supported"]
    assert out["data_layers"] == [{"layer": "mnist", "type": "Data", "tops": ["data", "label"]}]
    assert out["metric_loss_layers"] == [{"layer": "accuracy", "type": "Accuracy"},
                                         {"layer": "loss", "type": "SoftmaxWithLoss"}]
    assert "accuracy" not in out["quantized"] and out["onnx"]["ok"]


def test_lenet_float_scores_equal_a_plain_computation(tmp_path):
    model, weights, images, labels = _lenet(tmp_path)
    res = caffe_test(model, weights, iterations=3, device="cpu", quiet=True)
    w = _blobs(weights)
    accs, losses = [], []
    for it in range(3):  # 3 batches of 100 over 250 records: the third wraps round, as Caffe's reader
        idx = np.arange(it * 100, it * 100 + 100) % len(images)
        x = torch.tensor(images[idx].astype(np.float32) * np.float32(0.00390625))
        y = torch.tensor(labels[idx])
        scores = _lenet_plain(x, w)
        accs.append(float((_label_ranks(scores, y) < 1).float().mean()))
        losses.append(float(F.cross_entropy(scores, y)))
    got = res.forms[0].outputs
    assert got["accuracy"] == _caffe_means(accs)
    assert got["loss"] == pytest.approx(_caffe_means(losses), rel=1e-5)
    assert [(o.name, o.loss_weight) for o in res.outputs] == [("accuracy", 0.0), ("loss", 1.0)]
    assert res.forms[0].loss == pytest.approx(got["loss"], rel=1e-6)


def test_calibrate_from_the_net_data_then_test_every_form(tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    model, weights, images, labels = _lenet(tmp_path)
    out = str(tmp_path / "out" / "lenet")
    assert main(["calibrate", model, weights, "--batch-num", "2", "--onnx", "--onnx-activations", "int8",
                 "-o", out, "-q", "--device", "cpu"]) == 0
    report = json.loads(open(out + "_layer_report.json").read())
    assert report["held_out"] is True  # the batches after the calibration's
    capsys.readouterr()
    assert main(["test", model, weights, "--iterations", "2", "--quantized", out, "--json", "-q",
                 "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    forms = {f["form"]: f for f in res["forms"]}
    assert list(forms) == ["float", "fake_quant", "deploy", "onnx"]
    # the Caffe models keep the user's data, metric and loss layers
    text = open(out + "_deploy_model.prototxt").read()
    assert 'type: "Data"' in text and 'type: "Accuracy"' in text and 'type: "SoftmaxWithLoss"' in text
    # the int8 numbers are what ONNX Runtime gives on the exported model
    sess = ort.InferenceSession(out + "_quant.onnx", providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["data"] and [o.name for o in sess.get_outputs()] == ["ip2"]
    accs = []
    for it in range(2):
        idx = np.arange(it * 100, it * 100 + 100)
        x = images[idx].astype(np.float32) * np.float32(0.00390625)
        scores = torch.tensor(sess.run(["ip2"], {"data": x})[0])
        y = torch.tensor(labels[idx])
        accs.append(float((_label_ranks(scores, y) < 1).float().mean()))
    assert forms["onnx"]["outputs"]["accuracy"] == _caffe_means(accs)
    drop = forms["float"]["outputs"]["accuracy"] - forms["onnx"]["outputs"]["accuracy"]
    assert forms["onnx"]["drop"]["accuracy"] == pytest.approx(drop)


def test_imagenet_style_mean_file_crop_and_top5(tmp_path):
    d, rng, images, labels = _net_with_records(tmp_path, "inet", "train_val.prototxt", IMAGENET_STYLE_TRAIN_VAL,
                                               "examples/imagenet/val_lmdb", 3, (20, 3, 28, 30))
    (d / "data").mkdir()
    mean = rng.uniform(0, 255, size=(3, 28, 30)).astype(np.float32)
    write_mean(str(d / "data/imagenet_mean.binaryproto"), mean)
    random_weights(str(d / "train_val.prototxt"), str(d / "w.caffemodel"), std=0.02)
    res = caffe_test(str(d / "train_val.prototxt"), str(d / "w.caffemodel"), iterations=2, device="cpu", quiet=True)
    w = _blobs(str(d / "w.caffemodel"))
    top1, top5 = [], []
    h0, w0 = (28 - 24) // 2, (30 - 24) // 2  # Caffe's TEST crop: the centre, mean cropped with it
    for it in range(2):
        idx = np.arange(it * 10, it * 10 + 10)
        x = images[idx].astype(np.float32)[:, :, h0:h0 + 24, w0:w0 + 24] - mean[:, h0:h0 + 24, w0:w0 + 24]
        y = torch.tensor(labels[idx])
        s = F.relu(F.conv2d(torch.tensor(x), *w["conv1"]))
        s = F.max_pool2d(s, 3, 2, ceil_mode=True)
        s = F.linear(s.flatten(1), *w["fc8"])
        better = _label_ranks(s, y)
        top1.append(float((better < 1).float().mean()))
        top5.append(float((better < 5).float().mean()))
    got = res.forms[0].outputs
    assert got["accuracy"] == _caffe_means(top1) and got["accuracy_top5"] == _caffe_means(top5)
    assert sorted(got) == ["accuracy", "accuracy_top5", "loss"]


def test_cifar10_quick_mean_file_against_a_plain_computation(tmp_path):
    d, _, images, labels = _net_with_records(tmp_path, "cifar", "cifar10_quick_train_test.prototxt",
                                             CIFAR10_QUICK_TRAIN_TEST, "examples/cifar10/cifar10_test_lmdb", 5,
                                             (200, 3, 32, 32))
    mean = images.astype(np.float32).mean(0)  # what compute_image_mean writes
    write_mean(str(d / "examples/cifar10/mean.binaryproto"), mean)
    model, weights = str(d / "cifar10_quick_train_test.prototxt"), str(d / "w.caffemodel")
    random_weights(model, weights, std=0.05)
    res = caffe_test(model, weights, iterations=2, device="cpu", quiet=True)
    w = _blobs(weights)
    accs, losses = [], []
    for it in range(2):
        idx = np.arange(it * 100, it * 100 + 100)
        x = torch.tensor(images[idx].astype(np.float32) - mean)
        y = torch.tensor(labels[idx])
        x = F.relu(F.max_pool2d(F.conv2d(x, *w["conv1"], padding=2), 3, 2, ceil_mode=True))
        x = F.avg_pool2d(F.relu(F.conv2d(x, *w["conv2"], padding=2)), 3, 2, ceil_mode=True)
        x = F.avg_pool2d(F.relu(F.conv2d(x, *w["conv3"], padding=2)), 3, 2, ceil_mode=True)
        s = F.linear(F.linear(x.flatten(1), *w["ip1"]), *w["ip2"])
        accs.append(float((_label_ranks(s, y) < 1).float().mean()))
        losses.append(float(F.cross_entropy(s, y)))
    assert res.forms[0].outputs["accuracy"] == _caffe_means(accs)
    assert res.forms[0].outputs["loss"] == pytest.approx(_caffe_means(losses), rel=1e-5)


def test_label_out_of_range_is_one_line_naming_the_layer(tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "lenet_train_test.prototxt").write_text(LENET_TRAIN_TEST)
    rng = np.random.default_rng(0)
    labels = [3] * 99 + [12]  # 12 of 10 classes
    write_records(str(d / "examples/mnist/mnist_test_lmdb"), rng.integers(0, 256, (100, 1, 28, 28), dtype=np.uint8),
                  labels)
    random_weights(str(d / "lenet_train_test.prototxt"), str(d / "w.caffemodel"))
    with pytest.raises(DataError, match="label 12 is out of range") as err:
        caffe_test(str(d / "lenet_train_test.prototxt"), str(d / "w.caffemodel"), iterations=1, device="cpu",
                   quiet=True)
    assert err.value.layer == "accuracy"
    assert main(["test", str(d / "lenet_train_test.prototxt"), str(d / "w.caffemodel"), "--iterations", "1",
                 "-q", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "layer 'accuracy'" in lines[0]


def test_quantize_api_without_data(tmp_path):
    from amct_torch import quantize
    model, weights, _, _ = _lenet(tmp_path, count=400)
    res = quantize(model, weights, output=str(tmp_path / "o" / "m"), batch_num=2, batch_size=50,
                   device="cpu", quiet=True, report_batches=1)
    assert res.samples_used == 100  # 2 batches of --batch-size 50, not the layer's 100
    assert os.path.isfile(str(tmp_path / "o" / "m_fake_quant_model.prototxt"))


def test_accuracy_driven_calibration_uses_the_net_accuracy(tmp_path, capsys):
    from amct_torch import accuracy_based_auto_calibration
    from amct_torch.config import create_quant_config
    model, weights, _, _ = _lenet(tmp_path)
    float_acc = caffe_test(model, weights, iterations=2, device="cpu", quiet=True).forms[0].outputs["accuracy"]
    cfg = str(tmp_path / "cfg.json")
    create_quant_config(cfg, model, weights, batch_num=2)
    res = accuracy_based_auto_calibration(model, weights, None, cfg, str(tmp_path / "rec.txt"),
                                          str(tmp_path / "auto"), max_accuracy_drop=0.0, iterations=2)
    assert res.original_metric == float_acc  # the Accuracy top, averaged as caffe test does
    assert 100 * (res.original_metric - res.final_metric) <= 0.0
    for h in res.history:  # each evaluation judged by the allowed drop in points
        assert h["passed"] == (100 * (res.original_metric - h["metric"]) <= 1e-9)
    assert any(h["passed"] and h["float_layers"] == res.float_layers for h in res.history)
    # the command: a generous allowance keeps every layer quantized
    out = str(tmp_path / "cli" / "m")
    assert main(["calibrate", model, weights, "--max-accuracy-drop", "100", "--batch-num", "2", "--iterations",
                 "2", "-o", out, "-q", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "left in float: none" in text and os.path.isfile(out + "_record.txt")
    assert main(["calibrate", model, weights, "data/", "--max-accuracy-drop", "1", "-o", out, "-q"]) == 2


def test_calibrate_without_data_needs_a_readable_data_layer(tmp_path, capsys):
    import shutil

    from amct_torch.workflow.examples import example_model
    out = str(tmp_path / "o" / "m")
    assert main(["calibrate", *example_model(), "-o", out, "-q"]) == 2  # a deploy net: no data layer
    assert "no data layer" in capsys.readouterr().err
    model, weights, _, _ = _lenet(tmp_path)
    shutil.rmtree(str(tmp_path / "lenet" / "examples"))  # its LMDB is gone
    assert main(["calibrate", model, weights, "--onnx", "-o", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mnist_test_lmdb" in err[0] and "layer 'mnist'" in err[0]
    assert not os.path.exists(str(tmp_path / "o")) or not os.listdir(str(tmp_path / "o"))


def test_without_onnxruntime_the_caffe_forms_are_scored_and_the_onnx_one_named(tmp_path, monkeypatch):
    """An install without ONNX Runtime (the plain install) scores the Caffe forms and says, before
    any forward, which model it leaves out; the Caffe forms' numbers are those of a full run."""
    pytest.importorskip("onnxruntime")
    model, weights, _, _ = _lenet(tmp_path)
    out = str(tmp_path / "out" / "lenet")
    assert main(["calibrate", model, weights, "--batch-num", "2", "--onnx", "-o", out, "-q",
                 "--device", "cpu"]) == 0
    full = caffe_test(model, weights, iterations=2, quantized=out, quiet=True, device="cpu")
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # import now fails
    import logging

    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("amct_torch.quality.net_scores")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.WARNING)  # the calibrate run above was -q
    try:
        part = caffe_test(model, weights, iterations=2, quantized=out, quiet=True, device="cpu")
    finally:
        logger.removeHandler(handler)
    assert [f.form for f in full.forms] == ["float", "fake_quant", "deploy", "onnx"]
    assert [f.form for f in part.forms] == ["float", "fake_quant", "deploy"]
    assert [f.outputs for f in part.forms] == [f.outputs for f in full.forms[:3]]
    assert any(out + "_quant.onnx" in m and "ONNX Runtime is not installed" in m for m in warned)
