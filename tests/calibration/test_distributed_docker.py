"""The Docker image installs through the same script CI runs (no Docker engine here, so the
Dockerfile is checked as text): scripts/setup.sh with AMCT_NO_VENV=1, a non-root user, the
amct-torch entrypoint, and a build context that carries what the script needs."""
from __future__ import annotations

import fnmatch
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKER = os.path.join(ROOT, "docker")


def _instructions() -> list[tuple[str, str]]:
    with open(os.path.join(DOCKER, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", f.read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_installs_with_setup_script_without_venv():
    runs = [r for op, r in _instructions() if op == "RUN"]
    setup = [r for r in runs if "scripts/setup.sh" in r]
    assert setup, "the image must install through scripts/setup.sh"
    assert "AMCT_NO_VENV=1" in setup[0]
    assert not any(re.search(r"pip3? install", r) for r in runs), "install only through the script"
    assert os.path.isfile(os.path.join(ROOT, "scripts", "setup.sh"))


def test_cuda_base_non_root_entrypoint():
    ins = _instructions()
    base = [r for op, r in ins if op == "FROM"]
    assert base and "cuda" in base[0] and base[0].startswith("pytorch/pytorch:")
    users = [r for op, r in ins if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    # the last USER comes after the install
    ops = [op for op, _ in ins]
    assert max(i for i, op in enumerate(ops) if op == "USER") > \
        max(i for i, (op, r) in enumerate(ins) if op == "RUN" and "setup.sh" in r)
    assert [r for op, r in ins if op == "ENTRYPOINT"] == ['["amct-torch"]']


def test_build_context_has_what_setup_needs():
    """Every COPY source exists and survives docker/Dockerfile.dockerignore."""
    with open(os.path.join(DOCKER, "Dockerfile.dockerignore")) as f:
        rules = [l.strip() for l in f if l.strip() and not l.startswith("#")]

    def kept(path: str) -> bool:
        keep = True
        for rule in rules:
            neg = rule.startswith("!")
            pat = rule[1:] if neg else rule
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.replace("/**", "/*")) \
                    or (pat.endswith("/**") and path.startswith(pat[:-2])):
                keep = neg
        return keep

    for op, rest in _instructions():
        if op != "COPY":
            continue
        for src in rest.split()[:-1]:
            full = os.path.join(ROOT, src)
            assert os.path.exists(full), src
            files = [src] if os.path.isfile(full) else [
                os.path.relpath(os.path.join(d, n), ROOT) for d, _, ns in os.walk(full) for n in ns
                if "__pycache__" not in d]
            assert files and all(kept(p) for p in files if p.endswith((".py", ".sh", ".cfg", ".toml", ".md"))), src
    assert kept("scripts/setup.sh") and not kept(".venv/bin/python")
