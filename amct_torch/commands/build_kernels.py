"""``amct-torch build-kernels``: compile (or find) and verify the CPU calibration kernels now."""
from __future__ import annotations

import argparse
from typing import Any

from amct_torch.commands.shared import add_logging, command

EXAMPLES = """examples:
  amct-torch build-kernels        # compile (or find) and verify the CPU kernels, print where they are
  # in a Dockerfile, so that parallel jobs do not each compile them on first use:
  RUN amct-torch build-kernels
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = command(sub, "build-kernels", EXAMPLES, help="build and verify the compiled CPU kernels now",
                description="Compile (or find in the private cache) the CPU calibration kernels, "
                            "check them against the torch formulas, and say where they are. "
                            "Calibration does this itself before its first batch; run it once in a "
                            "Docker build step or before many parallel jobs.")
    add_logging(p)
    return p


def run(args: argparse.Namespace) -> int:
    from amct_torch import kernels
    from amct_torch.kernels import native
    lib = native.library()
    if lib is None:
        print(f"CPU kernels unavailable: {kernels.unavailable_reason()}; calibration uses the torch formulas")
        return 0 if kernels.turned_off() else 1
    print(f"CPU kernels ready: {lib._amct_path}")
    return 0
