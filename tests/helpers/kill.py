"""Helpers of the SIGKILL tests: run the real CLI and kill it at a chosen file-system step.

``python tests/kill_helpers.py ARGS...`` runs ``amct-torch ARGS`` in this process after wrapping
the file-system calls the output writers make (open for create, fsync, rename/replace, mkdir,
rmdir, unlink, chmod, rmtree). With ``AMCT_KILL_AT=K`` the process sends itself SIGKILL just
before the K-th such call — a pre-empted job, exactly at every step of writing and committing.
With ``AMCT_KILL_COUNT=FILE`` it writes the number of steps seen to FILE at exit.

The test functions then check what a kill left: every final-name file byte-equal to one
complete reference run, all of them from the same run.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Optional

SUFFIXES = ("_quant_config.json", "_record.txt", "_fake_quant_model.prototxt",
            "_fake_quant_weights.caffemodel", "_deploy_model.prototxt",
            "_deploy_weights.caffemodel", "_quant.json", "_layer_report.json", "_report.html")

_EVENTS = ("fsync", "replace", "rename", "mkdir", "rmdir", "unlink", "chmod")


def _install(kill_at: int, counter: list) -> None:
    def wrap(mod, name):
        orig = getattr(mod, name)

        def step(*args, **kwargs):
            counter[0] += 1
            if counter[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(*args, **kwargs)
        setattr(mod, name, step)

    for name in _EVENTS:
        wrap(os, name)
    wrap(shutil, "rmtree")
    orig_open = os.open

    def creating_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            counter[0] += 1
            if counter[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return orig_open(path, flags, *args, **kwargs)
    os.open = creating_open


def cli_command(args: list[str]) -> list[str]:
    """The command line that runs ``amct-torch args`` under the step wrapper."""
    return [sys.executable, os.path.abspath(__file__)] + list(args)


def run_cli(args: list[str], env: dict, kill_at: int = -1, count_file: Optional[str] = None,
            kill_after_s: Optional[float] = None, cwd: Optional[str] = None) -> int:
    """Run the wrapped CLI; ``kill_at``: SIGKILL before that step; ``kill_after_s``: the
    parent SIGKILLs it after that many seconds instead. Returns the exit status."""
    env = dict(env, AMCT_KILL_AT=str(kill_at))
    if count_file:
        env["AMCT_KILL_COUNT"] = count_file
    proc = subprocess.Popen(cli_command(args), env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=kill_after_s if kill_after_s is not None else 300)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        return -signal.SIGKILL
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"CLI failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return proc.returncode


def _html_of_any_run(html: bytes, prefix: str) -> bytes:
    """The visual report without what differs between two runs of the same job: the folder of
    the outputs it names (a set copied from another folder names that one) and the phase
    timings (``<td data-v="0.09...">0.09 s</td>``)."""
    import re
    name = re.escape(os.fsencode(os.path.basename(prefix)))
    html = re.sub(rb'[^<>"\s]*/' + name + rb'_', b"<out>/m_", html)
    return re.sub(rb'<td data-v="[0-9.e+-]+">[0-9.]+ s</td>', b"<td>time</td>", html)


def final_set(prefix: str) -> dict[str, Optional[bytes]]:
    """Suffix → bytes of every final-name output of ``prefix`` (None when absent; the HTML
    report without its paths and timings, which differ between any two runs)."""
    out: dict[str, Optional[bytes]] = {}
    for s in SUFFIXES:
        try:
            with open(prefix + s, "rb") as f:
                out[s] = f.read()
        except FileNotFoundError:
            out[s] = None
    if out.get("_report.html") is not None:
        out["_report.html"] = _html_of_any_run(out["_report.html"], prefix)
    return out


def main() -> int:
    kill_at = int(os.environ.get("AMCT_KILL_AT", "-1"))
    count_file = os.environ.get("AMCT_KILL_COUNT")
    import torch  # noqa: F401  (imports before counting: only the run's own steps count)

    from amct_torch.cli import main as cli
    counter = [0]
    _install(kill_at, counter)
    rc = cli(sys.argv[1:])
    if count_file:
        with open(count_file, "w") as f:
            f.write(str(counter[0]))
    return rc


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    sys.exit(main())
