"""The ``amct-torch`` command run for real in a subprocess: happy paths write the documented
files; every user error exits 2 with one line on stderr, no traceback, and no output files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from amct_torch.record import read_record
from amct_torch.workflow.examples import example_data, example_model
from helpers.runtimes import ort_optimized_ops, ort_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_FILES = ("_record.txt", "_quant_config.json", "_fake_quant_model.prototxt",
               "_fake_quant_weights.caffemodel", "_deploy_model.prototxt",
               "_deploy_weights.caffemodel", "_quant.json", "_layer_report.json", "_report.html")


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "amct_torch.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_user_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def example_npz(tmp_path_factory):
    x, _ = example_data("calib")
    p = tmp_path_factory.mktemp("data") / "calib.npz"
    np.savez(p, inputs=x[:64])
    return str(p)


def test_help_of_every_command_has_examples():
    res = cli("--help")
    assert res.returncode == 0 and "demo" in res.stdout and "calibrate" in res.stdout
    for cmd in ("calibrate", "convert", "config", "demo"):
        res = cli(cmd, "--help")
        assert res.returncode == 0 and "examples:" in res.stdout, cmd


def test_demo_with_no_arguments_prints_float_and_int8_accuracy(tmp_path):
    res = cli("demo", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    f = float(res.stdout.split("float32")[1].split("%")[0])
    q = float(res.stdout.split("int8")[1].split("%")[0])
    assert f > 90 and abs(f - q) <= 1.0
    prefix = tmp_path / "amct_demo" / "lenet_digits"
    for suffix in MODEL_FILES:
        assert os.path.isfile(f"{prefix}{suffix}"), suffix


def test_calibrate_npz_then_convert_the_record(tmp_path, example_npz):
    proto, weights = example_model()
    out = tmp_path / "out" / "lenet"
    res = cli("calibrate", proto, weights, example_npz, "--batch-num", "2", "--output", str(out),
              "--onnx", "--quiet")
    assert res.returncode == 0, res.stderr
    for suffix in MODEL_FILES + ("_quant.onnx",):
        assert os.path.isfile(f"{out}{suffix}"), suffix
    rec = read_record(f"{out}_record.txt")
    assert set(rec) == {"conv1", "conv2", "conv3", "pool2", "fc1", "fc2"}
    for name in rec:                                   # the summary table lists every layer
        assert name in res.stdout
    report = json.load(open(f"{out}_layer_report.json"))
    assert {l["layer"] for l in report["layers"]} == set(rec)
    conv = tmp_path / "conv" / "m"
    conv.parent.mkdir()
    res = cli("convert", proto, weights, f"{out}_record.txt", "--output", str(conv))
    assert res.returncode == 0, res.stderr
    for suffix in ("_fake_quant_model.prototxt", "_deploy_weights.caffemodel", "_quant.json"):
        assert os.path.isfile(f"{conv}{suffix}")
    # the models built from the record equal the ones calibrate wrote
    assert open(f"{conv}_deploy_weights.caffemodel", "rb").read() == \
        open(f"{out}_deploy_weights.caffemodel", "rb").read()


def test_calibrate_image_folder_with_preprocessing_and_config_command(tmp_path):
    proto, weights = example_model()
    x, _ = example_data("calib")
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(8):   # the example's inputs are pixel/16: store pixel values as PNG
        cv2.imwrite(str(folder / f"{i:02d}.png"), np.round(x[i, 0] * 16).astype(np.uint8))
    cfg = tmp_path / "cfg.json"
    res = cli("config", proto, weights, "--output", str(cfg), "--skip-layers", "fc2")
    assert res.returncode == 0, res.stderr
    assert json.load(open(cfg))["fc2"]["quant_enable"] is False
    out = tmp_path / "o" / "m"
    res = cli("calibrate", proto, weights, str(folder), "--config", str(cfg), "--scale", "0.0625",
              "--batch-size", "4", "--batch-num", "2", "--output", str(out), "--save-type", "Deploy")
    assert res.returncode == 0, res.stderr
    rec = read_record(f"{out}_record.txt")
    assert "fc2" not in rec and "conv1" in rec
    assert not os.path.exists(f"{out}_fake_quant_model.prototxt")


def _bad(tmp_path, *args):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    res = cli(*args, "--output", str(out / "m"))
    assert os.listdir(out) == [], os.listdir(out)
    return res


def test_missing_model_file(tmp_path, example_npz):
    _, weights = example_model()
    res = _bad(tmp_path, "calibrate", str(tmp_path / "nope.prototxt"), weights, example_npz)
    assert_user_error(res, "nope.prototxt", "not found")


def test_wrong_data_shape(tmp_path):
    proto, weights = example_model()
    np.save(tmp_path / "rgb.npy", np.zeros((4, 3, 16, 16), np.float32))
    res = _bad(tmp_path, "calibrate", proto, weights, str(tmp_path / "rgb.npy"))
    assert_user_error(res, "rgb.npy", "(N, 1, 16, 16)")


def test_non_image_file_in_the_data_folder(tmp_path):
    proto, weights = example_model()
    folder = tmp_path / "imgs"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.zeros((16, 16), np.uint8))
    (folder / "readme.md").write_text("# not an image")
    res = _bad(tmp_path, "calibrate", proto, weights, str(folder))
    assert_user_error(res, "readme.md")


def test_invalid_quant_cfg(tmp_path, example_npz):
    proto, weights = example_model()
    cfg = tmp_path / "quant.cfg"
    cfg.write_text('skip_layers: "no_such_layer"\n')
    res = _bad(tmp_path, "calibrate", proto, weights, example_npz, "--config", str(cfg))
    assert_user_error(res, "quant.cfg", "no_such_layer")


def test_bad_argument_is_one_line_too(tmp_path, example_npz):
    proto, weights = example_model()
    res = _bad(tmp_path, "calibrate", proto, weights, example_npz, "--batch-num", "0")
    assert_user_error(res, "--batch-num")
    res = _bad(tmp_path, "calibrate", proto, weights, example_npz, "--batch-num", "1000")
    assert_user_error(res, "batch_num")


def test_accuracy_search_refuses_the_options_it_would_drop(tmp_path):
    # refused before any file is read or calibration starts: nothing written under the prefix
    proto, weights = example_model()
    res = _bad(tmp_path, "calibrate", proto, weights, "--max-accuracy-drop", "1", "--onnx", "--save-type", "Deploy",
               "--mean", "3")
    assert_user_error(res, "--max-accuracy-drop", "--onnx", "--save-type", "preprocess")
    res = _bad(tmp_path, "calibrate", proto, weights, "--max-accuracy-drop", "1", "--improve", "all")
    assert_user_error(res, "--improve")
    assert "--onnx" not in res.stderr
    # a net it cannot judge (no Accuracy layer): the quant config it made is not published either
    res = _bad(tmp_path, "calibrate", proto, weights, "--max-accuracy-drop", "1")
    assert_user_error(res, "no Accuracy layer")


def test_calibrate_onnx_uint8_activations(tmp_path, example_npz):
    """--onnx-activations uint8: every activation QuantizeLinear has a uint8 zero point equal
    to the record's offset_d + 128 (the same grid as int8 with zero point offset_d)."""
    import onnx
    from onnx import numpy_helper
    proto, weights = example_model()
    out = tmp_path / "u8" / "lenet"
    res = cli("calibrate", proto, weights, example_npz, "--batch-num", "2", "--output", str(out),
              "--onnx", "--onnx-activations", "uint8", "--save-type", "Fakequant", "--quiet")
    assert res.returncode == 0, res.stderr
    rec = read_record(f"{out}_record.txt")
    model = onnx.load(f"{out}_quant.onnx")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    zps = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(z.dtype == np.uint8 for z in zps)
    assert {int(z) for z in zps} <= {r.offset_d + 128 for r in rec.values()}


def test_calibrate_onnx_speed_mode_runs_int8_adds_in_onnxruntime(tmp_path, example_npz):
    """--onnx-quantize-eltwise: the QDQ model of the example (whose residual add feeds a ReLU and
    an AVE pooling) runs in ONNX Runtime with the add as an int8 kernel and agrees with the
    float model's predictions on the calibration samples."""
    proto, weights = example_model()
    out = tmp_path / "speed" / "lenet"
    res = cli("calibrate", proto, weights, example_npz, "--batch-num", "2", "--output", str(out),
              "--onnx", "--onnx-activations", "uint8", "--onnx-quantize-eltwise",
              "--save-type", "Fakequant", "--quiet")
    assert res.returncode == 0, res.stderr
    ops = ort_optimized_ops(f"{out}_quant.onnx")
    assert ops["QLinearAdd"] > 0 and ops["Add"] == 0, ops
    x = np.load(example_npz)["inputs"][:64]
    q, = ort_run(f"{out}_quant.onnx", x).values()
    f, = ort_run(f"{out}_float.onnx", x).values()
    assert (q.argmax(1) == f.argmax(1)).mean() >= 0.95
