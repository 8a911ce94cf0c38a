"""``amct-torch inspect``: what a model has and whether it is supported, without data
(``workflow/inspect_model.py``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from amct_torch.commands.shared import add_field, add_logging, command

EXAMPLES = """examples:
  amct-torch inspect deploy.prototxt weights.caffemodel
  amct-torch inspect deploy.prototxt --config quant.cfg --json
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = command(sub, "inspect", EXAMPLES, help="what a model has and whether it is supported (no data needed)",
                description="Read MODEL (and WEIGHTS) and print its inputs and shapes, its layer "
                            "types with counts, the layers the config quantizes, every layer that "
                            "is not supported, and whether the ONNX export will work. Exit 0: "
                            "supported; 2: a file cannot be read; 3: something is not supported.")
    add_field(p, "model_file")
    add_field(p, "weights_file", nargs="?", default=None,
              help="caffemodel (optional: without it the structure and shapes are checked with zero weights)")
    p.add_argument("--config", default=None,
                   help="quant.cfg or JSON quant config (default: quantize every quantizable layer)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX export check")
    add_field(p, "allow_unknown_fields",
              help="list prototxt fields the tool does not read without counting them as unsupported")
    add_logging(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the answer; exit 0 (supported) or 3 (something unsupported)."""
    from amct_torch.errors import ModelError
    from amct_torch.inputs import check_regular_file
    from amct_torch.runtime import prefer_passive_waits

    # the function shares its module's name, so the package cannot give it (see test_front_doors.py)
    from amct_torch.workflow.inspect_model import inspect_model
    prefer_passive_waits()  # before torch loads: on a busy machine idle threads sleep, not spin
    for path, what in ((args.model, "model file"), (args.weights, "weights file")):
        if path is not None:
            check_regular_file(path, what, ModelError)
    res = inspect_model(args.model, args.weights, args.config, onnx=not args.no_onnx,
                        allow_unknown_fields=args.allow_unknown_fields)
    if args.json:
        json.dump(res.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(res.format())
    return res.exit_code
