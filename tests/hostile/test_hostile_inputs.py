"""Every hand-written hostile input (tests/hostile_cases.py: prototxt, caffemodel, quant.cfg,
JSON config, record, data files and image folders, output paths) gives, through the CLI and
through the API, in a child process under a memory limit: no traceback, exit 2 (AmctError for
the API), one line that names the user's file, and nothing written. A few go through the real
``python -m amct_torch.cli`` as well."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import helpers.hostile_cases as hc


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("hostile"))
    return work, hc.all_cases(work)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cli", "api"])
def test_every_hostile_case_is_one_clean_error(cases, mode):
    work, all_cases = cases
    results = hc.run_cases(all_cases, work, mode=mode)
    bad = {c.name: hc.problems(c, r) for c, r in zip(all_cases, results)}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{len(bad)} of {len(all_cases)} cases not clean: {bad}"
    # the memory limit held and nothing came near it (the worst case stays small)
    assert max(r["maxrss_mb"] for r in results) < hc.MEMORY_LIMIT_MB


def test_cases_cover_each_class(cases):
    _, all_cases = cases
    kinds = {c.kind for c in all_cases}
    assert kinds == {"prototxt", "caffemodel", "quant_cfg", "json", "record", "data", "outputs",
                     "checkpoint", "arguments", "rerun", "output_paths", "options", "evaluate"}
    assert len({c.name for c in all_cases}) == len(all_cases) >= 100


@pytest.mark.parametrize("name", ["prototxt/deep_nesting_3000", "data/npy_strings",
                                  "json/int_5000_digits", "record/quote_backslashes_80k",
                                  "outputs/config_over_model"])
def test_real_cli_process(cases, name):
    work, all_cases = cases
    case = next(c for c in all_cases if c.name == name)
    out = os.path.join(work, "real", name.replace("/", "_"), "m")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    argv = [a.replace("{out}", out) for a in case.argv]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "amct_torch.cli"] + argv, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert case.names in lines[0] and len(lines[0]) < 1000
    assert os.listdir(os.path.dirname(out)) == []
