"""Every module of the workflow layer (``amct_torch/workflow/``), of the command line
(``amct_torch/commands/``) and ``amct_torch/api.py`` talks to each package through its front
door: it imports ``amct_torch`` packages (their ``__init__``), modules directly under
``amct_torch`` and its own siblings, never another package's inner module -- at module level or
inside a function -- unless ``ALLOWED`` names the import and says why. The modules are found by
walking the folders, so a new one is held to this too. The front doors stay light (importing
them loads no torch, ONNX or OpenCV) and every name they export resolves.

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
#: the folders whose every module is held to front doors
FRONT_DOOR_FOLDERS = ("workflow", "commands")
#: the packages whose front doors import on first use
LAZY_PACKAGES = ("caffe", "calibration", "export", "files", "improve", "inputs", "quality", "runtime", "workflow")
#: (module, the inner module it imports) -> why it cannot go through the front door
ALLOWED = {
    ("amct_torch.workflow.inspect_model", "amct_torch.caffe.unknown_fields"):
        "the function unknown_fields shares its module's name: once the module is imported the "
        "package attribute is the module, so the front door cannot give the function",
    ("amct_torch.commands.evaluate", "amct_torch.quality.evaluate"):
        "the function evaluate shares its module's name (see unknown_fields)",
    ("amct_torch.commands.inspect", "amct_torch.workflow.inspect_model"):
        "the function inspect_model shares its module's name (see unknown_fields)",
    ("amct_torch.commands.calibrate", "amct_torch.caffe.read_ahead"):
        "the read-ahead is a module used as a namespace: start() here, take() in the loader",
    ("amct_torch.commands.build_kernels", "amct_torch.kernels.native"):
        "build-kernels reports the compiled library itself (native.library() and its path), "
        "which the kernels' front door keeps behind backend()",
}


def _modules() -> list[str]:
    """``amct_torch.api`` and every module of the front-door folders, found on disk."""
    out = ["amct_torch.api"]
    for folder in FRONT_DOOR_FOLDERS:
        for name in sorted(os.listdir(os.path.join(PACKAGE, folder))):
            if name.endswith(".py"):
                out.append(f"amct_torch.{folder}.{name[:-3]}")
    return out


def _source(module: str) -> str:
    return open(os.path.join(PACKAGE, *module.split(".")[1:]) + ".py", encoding="utf-8").read()


def _own(module: str) -> str:
    """The package whose inner modules ``module`` may import: its own (``amct_torch.api``: none)."""
    parts = module.split(".")
    return ".".join(parts[:-1]) if len(parts) > 2 else module


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


@pytest.mark.parametrize("module", _modules())
def test_the_module_imports_only_front_doors(module):
    inner = [t for t in back_doors(_source(module), _own(module)) if (module, t) not in ALLOWED]
    assert inner == []


def test_the_walk_finds_the_modules_and_every_allowance_is_still_needed():
    modules = _modules()
    for known in ("amct_torch.workflow.inspect_model", "amct_torch.workflow.options",
                  "amct_torch.commands.inspect", "amct_torch.commands.shared"):
        assert known in modules
    used = {(m, t) for m in modules for t in back_doors(_source(m), _own(m))}
    assert set(ALLOWED) <= used, set(ALLOWED) - used


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
