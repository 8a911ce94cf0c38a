"""``amct-torch evaluate``: run a model on data and compare each output with a reference model
(``quality/evaluate.py``), with calibrate's data and image preprocessing options."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from amct_torch.commands.arg_types import positive
from amct_torch.commands.shared import add_field, add_logging, model_command

EXAMPLES = """examples:
  # the deploy model against the float one, on the images and preprocessing calibrate used
  amct-torch evaluate out/resnet_deploy_model.prototxt out/resnet_deploy_weights.caffemodel images/ \\
      --reference deploy.prototxt weights.caffemodel --mean 104,117,123 --resize 256 --crop 224

  # the fake-quant model on arrays, 32 samples a batch, the first 10 batches, on the GPU
  amct-torch evaluate out/m_fake_quant_model.prototxt out/m_fake_quant_weights.caffemodel calib.npz \\
      --reference deploy.prototxt weights.caffemodel --batch-size 32 --max-batches 10 --device cuda
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from amct_torch.quality import DEFAULT_BATCH
    e = model_command(sub, "evaluate", EXAMPLES,
                      help="run a float, fake-quant or deploy model on data; SQNR/cosine per output "
                           "against a reference model",
                      description="Run MODEL WEIGHTS (any model amct_torch loads, the deploy model "
                                  "with its integer semantics included) on DATA, preprocessed as "
                                  "calibrate does, and print, per output blob, SQNR and cosine "
                                  "similarity against --reference.")
    e.add_argument("data", help="a folder of images or .npy/.npz, or one .npy/.npz file")
    e.add_argument("--reference", nargs=2, metavar=("FLOAT_MODEL", "FLOAT_WEIGHTS"),
                   help="the model to compare with (normally the float model)")
    e.add_argument("--batch-size", type=positive, default=DEFAULT_BATCH,
                   help="samples per batch (default: %(default)s)")
    e.add_argument("--max-batches", type=positive, default=None, help="stop after this many batches")
    add_field(e, "device")
    e.add_argument("--report-html", metavar="PATH", help="also write the table as a self-contained HTML page at PATH")
    add_field(e, "preprocess")  # calibrate's own options
    add_field(e, "allow_unknown_fields")
    add_logging(e)
    return e


def run(args: argparse.Namespace) -> int:
    """Print the table (and write the page); exit 0."""
    from amct_torch.errors import ModelError
    from amct_torch.inputs import check_regular_file, preprocess_from
    from amct_torch.quality import format_stats

    # the function shares its module's name, so the package cannot give it (see test_front_doors.py)
    from amct_torch.quality.evaluate import evaluate
    for path, what in ((args.model, "model file"), (args.weights, "weights file"),
                       *(((p, w) for p, w in zip(args.reference, ("reference model", "reference weights")))
                         if args.reference else ())):
        check_regular_file(path, what, ModelError)
    if args.report_html:
        from amct_torch.quality import check_page_path
        check_page_path(args.report_html, [args.model, args.weights, args.data, *(args.reference or ())])
    stats = evaluate(args.model, args.weights, args.data, args.reference, batch_size=args.batch_size,
                     max_batches=args.max_batches, preprocess=preprocess_from(args), device=args.device,
                     quiet=args.quiet)
    print(format_stats(stats))
    print(stats.coverage(), file=sys.stderr)  # beside the table, which stays rows only
    if args.report_html:
        from amct_torch.quality import write_page
        write_page(args.report_html, stats._repr_html_(), f"amct-torch evaluate: {os.path.basename(args.model)}")
    return 0
