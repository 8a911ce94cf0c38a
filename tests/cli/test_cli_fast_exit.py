"""The installed command ends its process itself once done: output flushed (also into a pipe),
the exit code kept, the files written; in-process calls (argv given) and
AMCT_TORCH_FAST_EXIT=0 keep the ordinary interpreter shutdown (atexit handlers run)."""
from __future__ import annotations

import os
import subprocess
import sys

from amct_torch.workflow.examples import example_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _console(args: list, **env: str) -> subprocess.CompletedProcess:
    code = ("import atexit, sys\nfrom amct_torch import cli\n"
            "atexit.register(lambda: print('ordinary shutdown', flush=True))\n"
            f"sys.argv = ['amct-torch'] + {args!r}\nsys.exit(cli.main())")
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=ROOT)


def test_console_run_exits_at_once_with_output_and_code(tmp_path):
    proto, weights = example_model()
    out = tmp_path / "cfg.json"
    done = _console(["config", proto, weights, "--output", str(out)])
    assert done.returncode == 0 and f"wrote {out}" in done.stdout
    assert "ordinary shutdown" not in done.stdout and out.is_file()
    bad = _console(["config", str(tmp_path / "missing.prototxt"), weights, "--output", str(tmp_path / "x.json")])
    assert bad.returncode == 2 and "error" in bad.stderr and "ordinary shutdown" not in bad.stdout


def test_opt_out_and_in_process_calls_keep_the_ordinary_exit(tmp_path):
    proto, weights = example_model()
    done = _console(["config", proto, weights, "--output", str(tmp_path / "c.json")], AMCT_TORCH_FAST_EXIT="0")
    assert done.returncode == 0 and "ordinary shutdown" in done.stdout
    from amct_torch import cli
    assert cli.main(["config", proto, weights, "--output", str(tmp_path / "d.json")]) == 0  # returns
