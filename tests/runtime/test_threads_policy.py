"""prefer_passive_waits: passive OpenMP waits only on a busy machine, only before torch loads,
never over the user's choice; the calibrate command reaches it before anything imports torch."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=e, cwd=ROOT).stdout.strip()


def _call(load: str) -> str:
    return ("import os\nfrom amct_torch.runtime.threads import prefer_passive_waits\n"
            f"print(prefer_passive_waits({load}), os.environ.get('OMP_WAIT_POLICY'))")


def test_passive_only_when_busy_before_torch_and_never_over_the_user():
    busy = "10.0 * (os.cpu_count() or 1)"
    assert _run(_call(busy)) == "True PASSIVE"
    assert _run(_call("0.0")) == "False None"
    assert _run(_call(busy), OMP_WAIT_POLICY="ACTIVE") == "False ACTIVE"
    assert _run("import torch\n" + _call(busy)) == "False None"


def test_calibrate_sets_it_before_torch_is_imported(tmp_path):
    """The command fails on a missing model file, after its process set-up: torch must not have
    been imported when the policy is decided (here on a machine declared busy)."""
    code = ("import os, sys\nfrom amct_torch import cli\n"
            "import amct_torch.runtime.threads as t\norig = t.prefer_passive_waits\n"
            "def spy():\n    print('torch loaded:', 'torch' in sys.modules)\n"
            "    return orig(load=1e9)\n"
            "t.prefer_passive_waits = spy\n"
            f"rc = cli.main(['calibrate', {str(tmp_path / 'no.prototxt')!r}, 'w', 'd'])\n"
            "print('policy:', os.environ.get('OMP_WAIT_POLICY'), 'rc:', rc)")
    out = _run(code)
    assert "torch loaded: False" in out and "policy: PASSIVE rc: 2" in out
