"""Each command imports only the heavy packages its options use: ONNX (onnx, onnxruntime)
only with ``--onnx`` or the ONNX check of ``inspect``, OpenCV only when images are decoded,
OpenVINO never (it is a test-only runtime); torch wherever layers are built, but not for
``config``, which reads the prototxt and the torch-free table of quantized layer types.

Each command's ``main`` runs in a fresh interpreter on the bundled example model, which then
reports ``sys.modules`` (the test process already holds everything)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from amct_torch.workflow.examples import example_data, example_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "onnx", "onnxruntime", "openvino", "cv2")
PROBE = f"""
import json, sys
from amct_torch import cli
try:
    cli.main(json.loads(sys.argv[1]))
except SystemExit as e:
    if e.code:
        raise
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def _imported(*argv: str) -> set:
    """The heavy packages ``amct-torch argv`` left imported (the command must succeed)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(argv))], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """The example model, its calibration data as one .npz and a record calibrated from it."""
    tmp = tmp_path_factory.mktemp("cmd")
    proto, weights = example_model()
    x, _ = example_data("calib")
    data = str(tmp / "calib.npz")
    np.savez(data, x[:8])
    out = str(tmp / "base" / "m")
    assert _imported("calibrate", proto, weights, data, "-o", out, "-q") == {"torch"}
    return tmp, proto, weights, data, out


def test_calibrate_without_onnx_imports_neither_onnx_nor_opencv(calibrated):
    # the fixture ran it: a default job on arrays imports torch alone
    _, _, _, _, out = calibrated
    assert os.path.isfile(f"{out}_record.txt")


def test_convert_imports_no_onnx_or_opencv(calibrated):
    tmp, proto, weights, _, out = calibrated
    assert _imported("convert", proto, weights, f"{out}_record.txt", "-o", str(tmp / "conv" / "m"), "-q") == {"torch"}


def test_config_imports_no_heavy_package(calibrated):
    tmp, proto, weights, _, _ = calibrated
    assert _imported("config", proto, weights, "-o", str(tmp / "cfg.json")) == set()
    assert _imported("config", proto, weights, "--skip-layers", "conv1", "--no-activation-offset", "--batch-num", "2",
                     "-o", str(tmp / "cfg2.json")) == set()
    cfg = tmp / "quant.cfg"
    cfg.write_text('batch_num: 2\nskip_layers: "conv1"\n')
    assert _imported("config", proto, weights, "--quant-cfg", str(cfg), "-o", str(tmp / "cfg3.json")) == set()


def test_inspect_imports_onnx_only_for_its_onnx_check(calibrated):
    _, proto, weights, _, _ = calibrated
    assert _imported("inspect", proto, weights, "--no-onnx") == {"torch"}
    with_check = _imported("inspect", proto, weights)
    assert {"torch", "onnx"} <= with_check and not {"cv2", "openvino"} & with_check


def test_images_import_opencv(calibrated):
    tmp, proto, weights, _, _ = calibrated
    x, _ = example_data("calib")
    folder = tmp / "imgs"
    folder.mkdir()
    for i in range(4):  # the example's inputs are pixel/16
        cv2.imwrite(str(folder / f"{i}.png"), np.round(x[i, 0] * 16).astype(np.uint8))
    got = _imported("calibrate", proto, weights, str(folder), "--scale", "0.0625", "-o", str(tmp / "img" / "m"), "-q")
    assert got == {"torch", "cv2"}


@pytest.mark.slow
def test_calibrate_with_onnx_imports_onnx(calibrated):
    tmp, proto, weights, data, _ = calibrated
    got = _imported("calibrate", proto, weights, data, "--onnx", "-o", str(tmp / "onnx" / "m"), "-q")
    assert {"torch", "onnx"} <= got and not {"cv2", "openvino"} & got
