"""``amct-torch convert``: the fake-quant and deploy Caffe models from an existing record."""
from __future__ import annotations

import argparse
import os
from typing import Any

from amct_torch.commands.printing import print_files
from amct_torch.commands.shared import add_field, add_logging, model_command

EXAMPLES = """examples:
  amct-torch convert deploy.prototxt weights.caffemodel record.txt --output out/model
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = model_command(sub, "convert", EXAMPLES,
                      help="build fake-quant and deploy models from an existing record",
                      description="Build the fake-quant and deploy Caffe models from a record file "
                                  "(no calibration); honours each entry's skip_fusion.")
    p.add_argument("record", help="scale/offset record file (protobuf text)")
    add_field(p, "output")
    add_field(p, "allow_unknown_fields")
    add_logging(p)
    return p


def run(args: argparse.Namespace) -> int:
    from amct_torch.api import convert_model
    from amct_torch.errors import ModelError, RecordError
    from amct_torch.inputs import check_regular_file
    for p, what, err in ((args.model, "model file", ModelError), (args.weights, "weights file", ModelError),
                         (args.record, "record file", RecordError)):
        check_regular_file(p, what, err)
    written = convert_model(args.model, args.weights, args.record, args.output)
    print_files({os.path.basename(p): p for p in written})
    return 0
