"""Imports on demand: the command's help and argument errors do not import torch, a job that
writes no ONNX model does not import onnx, and every public name still resolves.

Each check runs in a fresh interpreter (``sys.modules`` of the test process already holds
everything)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "onnx", "onnxruntime", "cv2")


def _loaded_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; which heavy modules it left imported."""
    probe = code + f"\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_and_argument_errors_do_not_import_torch():
    from amct_torch.cli import COMMANDS
    helps = [[command, "--help"] for command in COMMANDS]
    for argv in (["--help"], *helps, ["calibrate"], ["calibrate", "a", "b", "c", "--batch-size", "0"]):
        loaded = _loaded_after(f"from amct_torch import cli\ntry:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass")
        assert not any(loaded.values()), (argv, loaded)


def test_import_and_loading_do_not_import_onnx_or_opencv(nsfw_model):
    loaded = _loaded_after(f"import amct_torch\ngm = amct_torch.load_caffe({nsfw_model[0]!r}, {nsfw_model[1]!r})")
    assert loaded["torch"] and not loaded["onnx"] and not loaded["onnxruntime"] and not loaded["cv2"]


def test_every_public_name_resolves_to_its_module():
    import amct_torch.api
    import amct_torch.caffe.graph
    import amct_torch.workflow
    for name in amct_torch.__all__:
        assert getattr(amct_torch, name) is not None, name
    assert amct_torch.load_caffe is amct_torch.caffe.graph.load_caffe
    assert amct_torch.quantize is amct_torch.workflow.quantize
    assert set(amct_torch.__all__) <= set(dir(amct_torch))
    try:
        _ = amct_torch.no_such_name
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("unknown attribute did not raise")
