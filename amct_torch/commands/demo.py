"""``amct-torch demo``: the main job on the bundled example model, float vs int8 accuracy."""
from __future__ import annotations

import argparse
from typing import Any

from amct_torch.commands.shared import add_field, add_logging, command

EXAMPLES = """examples:
  amct-torch demo                 # quantize the bundled digits model, print float vs int8 accuracy
  amct-torch demo --output /tmp/demo/lenet --quiet
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = command(sub, "demo", EXAMPLES,
                help="quantize the bundled example model and print float vs int8 accuracy",
                description="The main job on the bundled example (a small digits CNN with BN and a "
                            "residual add): calibrate on its calibration split, then compare float "
                            "and int8 accuracy on the held-out split.")
    add_field(p, "output", default="amct_demo/lenet_digits")
    add_field(p, "batch_num", type="batch_count", default=4, help="calibration batches (default: %(default)s)")
    add_field(p, "device")
    add_logging(p)
    return p


def run(args: argparse.Namespace) -> int:
    from amct_torch.workflow import run_demo
    return run_demo(output=args.output, batch_num=args.batch_num, device=args.device, quiet=args.quiet)
