"""The one-call job talks to each package through its front door: the workflow modules listed
import ``amct_torch`` packages (their ``__init__``), modules directly under ``amct_torch`` and
their own siblings, never another package's inner module -- at module level or inside a
function. The front doors stay light (importing them loads no
torch, ONNX or OpenCV) and every name they export resolves.

Read from the source with ``ast``; the front doors are imported in a fresh interpreter."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "amct_torch")
#: the workflow modules held to front doors (inspect_model reads the Caffe layers' inner traits
#: by design, options.py declares the options from the packages' own name lists)
FRONT_DOOR_MODULES = ("__init__", "job", "result", "side_by_side", "demo", "examples")
#: the packages whose front doors import on first use
LAZY_PACKAGES = ("caffe", "calibration", "export", "files", "improve", "inputs", "quality", "runtime", "workflow")


def _is_package(name: str) -> bool:
    return os.path.isfile(os.path.join(PACKAGE, *name.split(".")[1:], "__init__.py"))


def _is_module(name: str) -> bool:
    return _is_package(name) or os.path.isfile(os.path.join(PACKAGE, *name.split(".")[1:]) + ".py")


def _exported(package: str, name: str) -> bool:
    """``name`` is one of the names ``package``'s front door gives (eager or on first use)."""
    tree = ast.parse(open(os.path.join(PACKAGE, *package.split(".")[1:], "__init__.py"), encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return name in ast.literal_eval(node.value)
    return False


def back_doors(source: str, own: str) -> list[str]:
    """The imports in ``source`` (a module of the package ``own``) that reach past another
    package's front door: ``amct_torch.x.y`` where ``amct_torch.x`` is a package, or ``from
    amct_torch.x import y`` where ``y`` is a module that the package does not export."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                       if _is_module(f"{node.module}.{a.name}")
                                       and not _exported(node.module, a.name)]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            if parts[0] != "amct_torch" or len(parts) <= 2 or t.startswith(own + "."):
                continue
            if _is_module(t):  # a module inside a package
                out.append(t)
    return out


@pytest.mark.parametrize("module", FRONT_DOOR_MODULES)
def test_the_workflow_imports_only_front_doors(module):
    source = open(os.path.join(PACKAGE, "workflow", f"{module}.py"), encoding="utf-8").read()
    assert back_doors(source, "amct_torch.workflow") == []


def test_the_check_finds_an_import_past_a_front_door():
    src = ("from amct_torch.inputs import plan_batches\nfrom amct_torch.errors import DataError\n"
           "from amct_torch.workflow.result import QuantizeResult\n"
           "def f():\n    from amct_torch.caffe.memory import checked_first_batch\n"
           "    import amct_torch.calibration.loop\n    from amct_torch.export import onnx\n")
    assert back_doors(src, "amct_torch.workflow") == ["amct_torch.caffe.memory", "amct_torch.calibration.loop",
                                                      "amct_torch.export.onnx"]


def test_front_doors_are_light_and_every_name_resolves():
    probe = f"""
import importlib, json, sys
heavy = ("torch", "onnx", "onnxruntime", "cv2")
pkgs = [importlib.import_module("amct_torch." + p) for p in {LAZY_PACKAGES!r}]
light = sorted(m for m in heavy if m in sys.modules)
missing = [f"{{p.__name__}}.{{n}}" for p in pkgs for n in p.__all__ if getattr(p, n, None) is None]
print(json.dumps([light, missing]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    light, missing = json.loads(out.stdout.strip().splitlines()[-1])
    assert light == [] and missing == []
