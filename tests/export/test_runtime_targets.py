"""The runtime targets are declared once, in a table read without onnx or torch: the command's
``--onnx-target`` choices are exactly its names, its ``rewritten`` field is what selects the
rewrites, and no code outside the table tells a target by comparing its name.

References: the names and fields written plainly below, the command's own help text (in a
fresh interpreter), and the package's source read with ``ast``."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from amct_torch.export.onnx import targets
from amct_torch.export.onnx.runtime_targets import ONNX_TARGETS, TARGETS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "amct_torch")


def test_the_table_names_each_target_with_what_it_fixes():
    fixed = {n: (t.activations, t.integer_ops, t.symmetric, t.rewritten) for n, t in TARGETS.items()}
    assert fixed == {"onnxruntime": (None, None, False, False), "openvino": ("uint8", False, False, True),
                     "tensorrt": ("int8", False, True, True)}
    assert ONNX_TARGETS == ("onnxruntime", "openvino", "tensorrt")  # the default first
    assert [t.streamed for t in TARGETS.values()] == [True, False, False]


def test_the_rewritten_targets_are_the_ones_with_rewrites():
    assert set(targets._REWRITES) == {n for n, t in TARGETS.items() if t.rewritten}


def test_calibrate_help_lists_exactly_the_tables_names_without_importing_onnx():
    probe = ("import sys\nfrom amct_torch.cli import main\ntry:\n    main(['calibrate', '--help'])\n"
             "except SystemExit:\n    pass\nprint('HEAVY', sorted(m for m in ('onnx', 'torch') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=ROOT, COLUMNS="200")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    choices = re.search(r"--onnx-target \{([^}]*)\}", out.stdout)
    assert choices is not None, out.stdout
    assert tuple(choices.group(1).split(",")) == tuple(TARGETS)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def _name_comparisons(path: str) -> list:
    """(line, text) of each comparison in ``path`` with a target's name as a string constant."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            if any(c.value in TARGETS for c in consts):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_code_compares_a_target_name():
    found = {}
    for folder, _dirs, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py") and not f.endswith("_pb2.py"):
                path = os.path.join(folder, f)
                hits = _name_comparisons(path)
                if hits:
                    found[os.path.relpath(path, ROOT)] = hits
    assert found == {}


def test_the_comparison_finder_finds_one(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(target):\n    ok = target in ('x', 'y')\n"
                 "    return target == 'onnxruntime' or 'tensorrt' != target\n")
    assert _name_comparisons(str(p)) == [(3, "target == 'onnxruntime'"), (3, "'tensorrt' != target")]
