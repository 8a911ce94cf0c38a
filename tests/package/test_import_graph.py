"""The package's import graph has no cycles and keeps its floors (docs/design.md).

Read from the source with ``ast`` (imports inside functions count too: a lazy import that
closes a cycle still ties two modules together), checked with a plain depth-first search.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "amct_torch")


def _modules() -> dict:
    out = {}
    for folder, _dirs, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py") and not f.endswith("_pb2.py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[:-9] if rel.endswith(".__init__") else rel] = path
    return out


def _imports(name: str, path: str, known: dict) -> set:
    deps = set()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {d for d in deps if d in known and d != name}


def _graph() -> dict:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _find_cycle(graph: dict):
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None
    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycles():
    assert _find_cycle(_graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_floors():
    graph = _graph()
    for name, deps in graph.items():
        if name.startswith("amct_torch.algorithms"):
            assert not {d for d in deps if d.startswith(("amct_torch.kernels", "amct_torch.calibration"))}, name
        if not name.startswith(("amct_torch.workflow", "amct_torch.cli", "amct_torch.commands", "amct_torch.__init__")) \
                and name != "amct_torch":
            assert not {d for d in deps if d.startswith("amct_torch.workflow")}, name
        # the command line is the top floor: only cli.py imports its commands
        if not name.startswith(("amct_torch.cli", "amct_torch.commands")):
            assert not {d for d in deps if d.startswith("amct_torch.commands")}, name
        if name.startswith("amct_torch.kernels"):
            assert not {d for d in deps if d.startswith("amct_torch.calibration")}, name
        # the AMCT steps work in memory below AMCT's file-based API and the one-call job
        if name.startswith("amct_torch.steps"):
            assert not {d for d in deps if d.startswith(
                ("amct_torch.api", "amct_torch.workflow", "amct_torch.quality", "amct_torch.cli"))}, name
        if name == "amct_torch.api":
            assert not {d for d in deps if d.startswith(("amct_torch.workflow", "amct_torch.cli"))}, name
        # the plumbing under everything: files/ and runtime/ stand on errors.py alone
        if name.startswith(("amct_torch.files", "amct_torch.runtime")):
            assert all(d.startswith(("amct_torch.files", "amct_torch.runtime", "amct_torch.errors")) for d in deps), name
        # calibration is the floor the steps stand on
        if name.startswith(("amct_torch.calibration", "amct_torch.record", "amct_torch.export")):
            assert not {d for d in deps if d.startswith(("amct_torch.steps", "amct_torch.api"))}, name
