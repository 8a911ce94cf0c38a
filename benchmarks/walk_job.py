"""The walk of the one-call job: which modules the user's ``model_file`` passes through, in order.

Why: a job that talks to each package through its front door hands the model's path down and
gets answers back; one that reaches into internals bounces between many rooms. The job
(``amct_torch.quantize`` on the bundled example, CPU, default outputs) runs under
``sys.settrace`` (main thread); what is counted (holding frames, stays, rooms, climbs back,
entries, job.py's calls and imports): benchmarks/results/README.md, "The one-call job's walk".

Run: PYTHONPATH=<tree> .venv/bin/python benchmarks/walk_job.py [--stays]
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
from typing import Any, Optional

from torch.nn import Module as _Module

JOB = "amct_torch.workflow.job"
#: the modules counted as the batch-planning room (before: workflow/batching.py; after: inputs/)
PLAN_MODULES = ("amct_torch.workflow.batching", "amct_torch.inputs.plan", "amct_torch.inputs.batching")


def _holds(value: Any, path: str, objects: bool) -> bool:
    """``value`` is ``path``, or holds it one level down (``objects``: in any amct_torch
    object's attributes, else in a dataclass's fields)."""
    if isinstance(value, str):
        return value == path
    if isinstance(value, (tuple, list)):
        return any(isinstance(v, str) and v == path for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, str) and v == path for v in value.values())
    if isinstance(value, type) or not type(value).__module__.startswith("amct_torch"):
        return False
    if not (dataclasses.is_dataclass(value) or objects) or isinstance(value, _Module):
        return False  # a Caffe layer keeps the model file for its errors: not the job's route
    return hasattr(value, "__dict__") and any(isinstance(v, str) and v == path for v in vars(value).values())


def _arguments(frame: Any) -> list:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    local = frame.f_locals
    return [local.get(name) for name in code.co_varnames[:n]]


class Walk:
    """The tracer: records the walk of one path through the package's modules."""

    GEN = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

    def __init__(self, path: str, package_dir: str, objects: bool = False) -> None:
        self.path, self.objects = path, objects
        self.root = package_dir + os.sep
        self.stack: list = []  # the holding frames now running, innermost last
        self.seen_generators: set = set()  # generator frames already started (kept alive)
        self.keep: list = []
        self.steps: list[tuple[str, str]] = []  # (module, "call" | "return")
        self.job_calls: dict[str, int] = {}  # module -> calls job.py made into it

    def _note(self, module: str, how: str) -> None:
        if not self.steps or self.steps[-1][0] != module:
            self.steps.append((module, how))

    def call(self, frame: Any, event: str, arg: Any) -> Optional[Any]:
        if event != "call" or not frame.f_code.co_filename.startswith(self.root):
            return None
        if frame.f_code.co_flags & self.GEN:
            if id(frame) in self.seen_generators:
                return None  # a resumption, not a new call
            self.seen_generators.add(id(frame))
            self.keep.append(frame)  # its id stays unique while the walk runs
        caller = frame.f_back
        if caller is not None and caller.f_globals.get("__name__") == JOB:
            module = frame.f_globals.get("__name__", "?")
            if module != JOB:
                self.job_calls[module] = self.job_calls.get(module, 0) + 1
        if not any(_holds(v, self.path, self.objects) for v in _arguments(frame)):
            return None
        self.stack.append(frame)
        self._note(frame.f_globals.get("__name__", "?"), "call")
        return self.local

    def local(self, frame: Any, event: str, arg: Any) -> Optional[Any]:
        if event == "return" and self.stack and self.stack[-1] is frame:
            self.stack.pop()
            if self.stack:
                self._note(self.stack[-1].f_globals.get("__name__", "?"), "return")
        return self.local

    def summary(self) -> dict:
        modules = [m for m, _ in self.steps]
        entries = {m: modules.count(m) for m in set(modules)}
        return {"stays": len(self.steps), "rooms": len(entries),
                "climbs_back": sum(1 for _, how in self.steps if how == "return"),
                "job_entries": entries.get(JOB, 0),
                "plan_entries": sum(entries.get(m, 0) for m in PLAN_MODULES),
                "job_calls": sum(self.job_calls.values()),
                "job_calls_plan": sum(self.job_calls.get(m, 0) for m in PLAN_MODULES),
                "job_calls_modules": len(self.job_calls),
                "job_calls_modules_per_package": _per_package(self.job_calls),
                "job_calls_by_module": dict(sorted(self.job_calls.items()))}


def _per_package(modules: dict) -> dict[str, int]:
    """package (``amct_torch.x``) -> how many of its modules ``modules`` names."""
    out: dict[str, int] = {}
    for m in modules:
        package = ".".join(m.split(".")[:2])
        out[package] = out.get(package, 0) + 1
    return dict(sorted(out.items()))


def job_imports(job_file: str, package_dir: str) -> dict:
    """The amct_torch modules ``job_file`` imports, at module level and inside functions."""
    tree = ast.parse(open(job_file, encoding="utf-8").read())
    top_level = {id(n) for n in tree.body}

    def is_module(name: str) -> bool:
        rel = os.path.join(package_dir, *name.split(".")[1:])
        return os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py"))

    def submodule(package: str, name: str) -> bool:
        """``from package import name`` reads a module (not a name the package exports)."""
        init = os.path.join(package_dir, *package.split(".")[1:], "__init__.py")
        if not is_module(f"{package}.{name}"):
            return False
        if not os.path.isfile(init):
            return True
        return not re.search(rf"(?<![\w.]){re.escape(name)}\b(?!\.)", open(init, encoding="utf-8").read())

    found: dict[str, set] = {"module_level": set(), "lazy": set()}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" if submodule(node.module, a.name) else node.module
                     for a in node.names]
        names = [n for n in names if n.startswith("amct_torch")]
        found["module_level" if id(node) in top_level else "lazy"].update(names)

    def internal(name: str) -> bool:
        parts = name.split(".")
        is_package = os.path.isfile(os.path.join(package_dir, *parts[1:], "__init__.py"))
        return not (is_package or len(parts) <= 2 or name.startswith("amct_torch.workflow."))

    every = found["module_level"] | found["lazy"]
    return {"count": len(every), "module_level": sorted(found["module_level"]),
            "lazy": sorted(found["lazy"] - found["module_level"]),
            "internal": sorted(n for n in every if internal(n))}


def main(argv: Optional[list] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stays", action="store_true", help="also print the walk, one stay per entry")
    args = ap.parse_args(argv)
    import logging

    import amct_torch
    from amct_torch.workflow.examples import example_data, example_model

    logging.getLogger("amct_torch").setLevel(logging.ERROR)
    package_dir = os.path.dirname(os.path.abspath(amct_torch.__file__))
    spec = importlib.util.find_spec("amct_torch.workflow.job")
    assert spec is not None and spec.origin is not None
    model, weights = example_model()
    x, _ = example_data("calib")
    walks = [Walk(model, package_dir), Walk(model, package_dir, objects=True)]
    for walk in walks:
        with tempfile.TemporaryDirectory() as tmp:
            sys.settrace(walk.call)
            try:
                amct_torch.quantize(model, weights, x, output=os.path.join(tmp, "m"), device="cpu", quiet=True)
            finally:
                sys.settrace(None)
    walk, with_objects = walks
    shape = ("stays", "rooms", "climbs_back", "job_entries", "plan_entries")
    out: dict[str, Any] = {"case": "walk", "tree": os.path.dirname(package_dir), **walk.summary(),
                           "with_objects": {k: with_objects.summary()[k] for k in shape},
                           "job_imports": job_imports(spec.origin, package_dir)}
    if args.stays:
        out["walk"] = [f"{'<' if how == 'return' else '>'} {m}" for m, how in walk.steps]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
