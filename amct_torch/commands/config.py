"""``amct-torch config``: the JSON quant config of a model (AMCT's ``create_quant_config``)."""
from __future__ import annotations

import argparse
import os
from typing import Any

from amct_torch.commands.shared import add_field, add_logging, model_command
from amct_torch.errors import AmctError

EXAMPLES = """examples:
  amct-torch config deploy.prototxt weights.caffemodel --output quant_config.json
  amct-torch config deploy.prototxt weights.caffemodel --skip-layers conv1,fc8 --batch-num 4
  amct-torch config deploy.prototxt weights.caffemodel --quant-cfg quant.cfg -o config.json
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = model_command(sub, "config", EXAMPLES,
                      help="write the JSON quant config (AMCT's create_quant_config)",
                      description="Write the JSON quant config of a model (defaults, or from a quant.cfg).")
    add_field(p, "output", default="quant_config.json", help="JSON file to write (default: %(default)s)")
    p.add_argument("--quant-cfg", help="quant.cfg: when given it decides everything (as in AMCT)")
    add_field(p, "skip_layers", help="comma-separated layers not to quantize (without --quant-cfg)")
    add_field(p, "batch_num", type="batch_count", default=1, help="calibration batches (default: %(default)s)")
    add_field(p, "activation_offset", help="symmetric activations (offset_d = 0; without --quant-cfg)")
    add_field(p, "allow_unknown_fields")
    add_logging(p)
    return p


def run(args: argparse.Namespace) -> int:
    from amct_torch.config import create_quant_config
    from amct_torch.files import check_output_name, check_outputs, make_folder
    check_output_name(args.output, "--output")
    if args.quant_cfg and (args.skip_layers or not args.activation_offset):
        given = "--skip-layers" if args.skip_layers else "--no-activation-offset"
        raise AmctError(f"{given} applies only without --quant-cfg: the quant.cfg decides "
                        "everything (as in AMCT); put it in the quant.cfg", file=args.quant_cfg)
    check_outputs([args.output], [args.model, args.weights, args.quant_cfg])
    make_folder(os.path.dirname(os.path.abspath(args.output)))
    create_quant_config(args.output, args.model, args.weights, skip_layers=args.skip_layers,
                        batch_num=args.batch_num, activation_offset=args.activation_offset,
                        config_defination=args.quant_cfg)
    print(f"wrote {args.output}")
    return 0
