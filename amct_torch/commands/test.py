"""``amct-torch test``: ``caffe test`` without Caffe, float and quantized side by side
(``quality/net_scores.py``)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from amct_torch.commands.arg_types import positive
from amct_torch.commands.shared import add_field, add_logging, command
from amct_torch.quality import AP_VERSIONS, DEFAULT_AP_VERSION

EXAMPLES = """examples:
  # caffe test -model train_val.prototxt -weights w.caffemodel -iterations 100, without Caffe
  amct-torch test train_val.prototxt w.caffemodel --iterations 100

  # the float model and every quantized form calibrate wrote under out/model, side by side
  amct-torch calibrate train_val.prototxt w.caffemodel --output out/model --onnx
  amct-torch test train_val.prototxt w.caffemodel --quantized out/model --json
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = command(sub, "test", EXAMPLES,
                help="caffe test: average the net's accuracy and loss over N batches of its "
                     "TEST data, float and quantized side by side",
                description="N iterations of the TEST phase of a train/test net (its data "
                            "layers' data, its metric and loss layers), every scalar output "
                            "averaged as caffe test prints it; with --quantized, also each "
                            "quantized form calibrate wrote under that prefix, with the drop.")
    add_field(p, "model_file", help="train_val or test prototxt (with data layers)")
    add_field(p, "weights_file", help="float caffemodel")
    p.add_argument("--iterations", type=positive, default=50, help="batches (default: %(default)s, as caffe test)")
    p.add_argument("--quantized", metavar="PREFIX",
                   help="a calibrate --output prefix: also score its fake-quant and deploy Caffe "
                        "models and its QDQ ONNX model (ONNX Runtime)")
    p.add_argument("--ap-version", choices=AP_VERSIONS, default=DEFAULT_AP_VERSION,
                   help="how an SSD net's DetectionEvaluate output becomes its mAP, as the SSD "
                        "fork's solver ap_version (default: %(default)s, the fork's default; "
                        "VOC2007 nets use 11point)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    page = p.add_mutually_exclusive_group()
    page.add_argument("--report-html", metavar="PATH",
                      help="write the visual report (summary, float vs int8 accuracy) at PATH "
                           "(default with --quantized: PREFIX_test_report.html)")
    page.add_argument("--no-report", action="store_true", help="write no report page")
    add_field(p, "device")
    add_logging(p)
    return p


def report_path(args: Any) -> Optional[str]:
    """Where ``test`` writes its page: ``--report-html``, else ``PREFIX_test_report.html`` with
    ``--quantized PREFIX``; None with ``--no-report`` or neither."""
    from amct_torch.files import TEST_REPORT_SUFFIX
    if getattr(args, "no_report", False):
        return None
    if getattr(args, "report_html", None):
        return str(args.report_html)
    return args.quantized + TEST_REPORT_SUFFIX if args.quantized else None


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON) and write the page (``report_path``)."""
    from amct_torch.runtime import keep_freed_memory, prefer_passive_waits
    prefer_passive_waits()  # before torch loads: idle OpenMP threads sleep while the decoders run
    keep_freed_memory()  # each batch reuses the last one's activation memory
    from amct_torch.quality import caffe_test, check_page_path, format_result
    page = report_path(args)
    if page is not None:
        check_page_path(page, [args.model, args.weights])
    result = caffe_test(args.model, args.weights, iterations=args.iterations, quantized=args.quantized,
                        device=args.device, quiet=args.quiet, ap_version=args.ap_version)
    if page is not None:
        result.write_html(page)
    if args.json:
        out = result.as_json()
        if page is not None:
            out["html_report"] = page
        print(json.dumps(out, indent=2))
    else:
        print(format_result(result))
        if page is not None and not args.quiet:
            print(f"report: {page}")
    return 0
