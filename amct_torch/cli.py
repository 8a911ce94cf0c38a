"""The ``amct-torch`` command: calibrate a Caffe model, convert a record, write a quant config,
or run the demo on the bundled example.

Why a CLI: a Caffe user should get an 8-bit model from a folder of images with one command,
with the preprocessing knobs they know from Caffe's ``transform_param``. Every user error
(AmctError, missing or unreadable files, bad arguments) prints one line and exits with code
2; nothing is left half-written (the API writes through temporary files).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, Optional

from amct_torch.errors import AmctError, excerpt
from amct_torch.export.formats import prefix_suffixes
from amct_torch.export.onnx import ONNX_ACTIVATIONS
from amct_torch.export.onnx.runtime_targets import ONNX_TARGETS
from amct_torch.files.transaction import Terminated, abort_open
from amct_torch.inputs.preprocess_options import add_preprocess_options, preprocess_from

log = logging.getLogger("amct_torch")

EXIT_USER_ERROR = 2

CALIBRATE_EXAMPLES = """examples:
  # ImageNet-style Caffe model, a folder of JPEGs, Caffe's usual preprocessing
  amct-torch calibrate deploy.prototxt weights.caffemodel images/ \\
      --mean 104,117,123 --resize 256 --crop 224 --batch-size 8 --batch-num 4 --output out/resnet

  # AMCT quant.cfg (skip layers, HFMG, overrides) and an ONNX QDQ model too
  amct-torch calibrate deploy.prototxt weights.caffemodel calib.npz --config quant.cfg --onnx

  # 4 GPUs, each calibrating a quarter of the batches; resumable if the job is killed
  torchrun --nproc_per_node=4 -m amct_torch.cli calibrate deploy.prototxt weights.caffemodel \\
      images/ --batch-num 16 --distributed --checkpoint out/calib.ckpt --output out/resnet

  # beyond AMCT: fold each quantized layer's mean output error into its bias
  amct-torch calibrate deploy.prototxt weights.caffemodel images/ --mean 104,117,123 --improve bias_correction

outputs (prefix --output):
""" + textwrap.fill("  ".join(prefix_suffixes()), width=96, initial_indent="  ", subsequent_indent="  ",
                    break_on_hyphens=False) + "\n"

CONVERT_EXAMPLES = """examples:
  amct-torch convert deploy.prototxt weights.caffemodel record.txt --output out/model
"""

CONFIG_EXAMPLES = """examples:
  amct-torch config deploy.prototxt weights.caffemodel --output quant_config.json
  amct-torch config deploy.prototxt weights.caffemodel --skip-layers conv1,fc8 --batch-num 4
  amct-torch config deploy.prototxt weights.caffemodel --quant-cfg quant.cfg -o config.json
"""

BUILD_KERNELS_EXAMPLES = """examples:
  amct-torch build-kernels        # compile (or find) and verify the CPU kernels, print where they are
  # in a Dockerfile, so that parallel jobs do not each compile them on first use:
  RUN amct-torch build-kernels
"""

DEMO_EXAMPLES = """examples:
  amct-torch demo                 # quantize the bundled digits model, print float vs int8 accuracy
  amct-torch demo --output /tmp/demo/lenet --quiet
"""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (exit code 2, no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def _int_at_least(text: str, low: int, what: str) -> int:
    """``text`` as an integer >= ``low``, else an argument error saying ``what`` was expected."""
    try:
        v = int(text)
    except ValueError:
        v = low - 1
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def _positive(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _non_negative(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def _batch_count(text: str) -> int:
    """A batch count in [1, MAX_BATCH_NUM]: an absurd one is refused here, not after the model
    is read (it overflowed the config's 32-bit field with a traceback)."""
    from amct_torch.inputs.limits import MAX_BATCH_NUM
    v = _positive(text)
    if v > MAX_BATCH_NUM:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH_NUM} batches, got {text!r}")
    return v


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, warnings and errors only")
    p.add_argument("-v", "--verbose", action="store_true", help="log each step (INFO)")


def _model_command(sub: Any, name: str, examples: str, **texts: str) -> argparse.ArgumentParser:
    """A command that reads a Caffe model: its parser (``texts``: help and description;
    ``examples`` after the options, as written) with the deploy prototxt and the caffemodel as
    its first arguments, the same for every such command."""
    p = sub.add_parser(name, epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter, **texts)
    p.add_argument("model", help="deploy, test or train_val prototxt")
    p.add_argument("weights", help="caffemodel")
    add_allow_unknown_fields(p)
    return p


def add_allow_unknown_fields(p: argparse.ArgumentParser) -> None:
    """``--allow-unknown-fields``: build models from a prototxt with fields the tool does not
    read (refused otherwise: the numbers may differ; ``inspect`` lists them)."""
    p.add_argument("--allow-unknown-fields", action="store_true",
                   help="run a prototxt whose layers have fields this tool does not read (a Caffe "
                        "fork's parameters; 'inspect' lists them) without those fields; refused otherwise")


def _names(text: str) -> list[str]:
    """A comma-separated list of names (empty items dropped)."""
    return [x for x in text.split(",") if x]


def _option_fields() -> list:
    """The ``QuantizeOptions`` fields that are ``calibrate`` arguments one to one."""
    from dataclasses import fields

    from amct_torch.workflow.options import QuantizeOptions
    return [f for f in fields(QuantizeOptions) if f.metadata.get("cli")]


def _option_arguments(p: argparse.ArgumentParser) -> None:
    """Add the one-to-one options to ``calibrate``: flags, default and help come from the
    field's declaration (``workflow/options.py``); the argument's dest is the field's name."""
    types = {"positive": _positive, "names": _names, "improvements": _improvements}
    for f in _option_fields():
        cli = dict(f.metadata["cli"])
        flags = cli.pop("flags")
        if "type" in cli:
            cli["type"] = types[cli["type"]]
        cli.setdefault("help", f.metadata["help"])
        cli.setdefault("default", f.default)
        p.add_argument(*flags, dest=f.name, **cli)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="amct-torch",
                     description="Post-training 8-bit quantization of Caffe models with PyTorch "
                                 "(AMCT-compatible record, fake-quant and deploy models).",
                     epilog="run 'amct-torch demo' to see it work on the bundled example model; "
                            "'amct-torch COMMAND --help' for each command's options and examples",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from amct_torch import __version__
    parser.add_argument("--version", action="version", version=f"amct-torch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = _model_command(sub, "calibrate", CALIBRATE_EXAMPLES,
                       help="calibrate a Caffe model on data and write the quantized models",
                       description="Fuse BN, quantize weights (ARQ) and calibrate activations "
                                   "(IFMR/HFMG) on your data; write the record and the models.")
    c.add_argument("data", nargs="?",
                   help="calibration data: a folder of images, a folder of .npy/.npz, or one .npy/.npz "
                        "file; left out: the TEST-phase data layer of a train/test prototxt")
    _option_arguments(c)  # the one-to-one options, declared with their QuantizeOptions field
    add_preprocess_options(c)
    c.add_argument("--onnx", action="store_true", help="also write the float and the QDQ ONNX model")
    c.add_argument("--onnx-activations", choices=ONNX_ACTIVATIONS, default=None,
                   help="activation type of the QDQ model: uint8 (zero point offset_d+128, default: "
                        "the same numbers as int8, and ONNX Runtime fuses more int8 kernels) or "
                        "int8 (zero point = offset_d)")
    c.add_argument("--onnx-target", choices=ONNX_TARGETS, default=None,
                   help=f"runtime the QDQ model is laid out for (default: {ONNX_TARGETS[0]}): openvino "
                        "(plain QDQ, uint8) or tensorrt (int8, zero point 0: needs "
                        "--no-activation-offset or a config with activation_offset: false); "
                        "the target fixes the activation type")
    c.add_argument("--no-activation-offset", action="store_true",
                   help="symmetric activations (offset_d = 0; without --config)")
    c.add_argument("--onnx-quantize-eltwise", action="store_true",
                   help="ONNX speed mode (opt-in, no longer AMCT-exact): also quantize residual "
                        "conv outputs and Eltwise SUMs so ONNX Runtime runs every conv and add as "
                        "an int8 kernel; use with --onnx-activations uint8")
    c.add_argument("--report-batches", type=_non_negative, default=2,
                   help="held-out batches for the per-layer report (0: none)")
    c.add_argument("--report-rows", type=_non_negative, default=15,
                   help="rows of the per-layer table printed (default: %(default)s)")
    c.add_argument("--max-accuracy-drop", type=float, metavar="POINTS",
                   help="accuracy-driven calibration of a train/test net with an Accuracy layer (no "
                        "DATA: its own TEST data): keep the fewest most sensitive layers in float so "
                        "that the int8 model loses at most POINTS percentage points of accuracy")
    c.add_argument("--iterations", type=_positive, default=50,
                   help="with --max-accuracy-drop: batches each accuracy is averaged over (default: "
                        "%(default)s, as caffe test)")
    _common(c)

    v = _model_command(sub, "convert", CONVERT_EXAMPLES,
                       help="build fake-quant and deploy models from an existing record",
                       description="Build the fake-quant and deploy Caffe models from a record file "
                                   "(no calibration); honours each entry's skip_fusion.")
    v.add_argument("record", help="scale/offset record file (protobuf text)")
    v.add_argument("-o", "--output", default="amct_output/model", help="output path prefix (default: %(default)s)")
    _common(v)

    g = _model_command(sub, "config", CONFIG_EXAMPLES,
                       help="write the JSON quant config (AMCT's create_quant_config)",
                       description="Write the JSON quant config of a model (defaults, or from a quant.cfg).")
    g.add_argument("-o", "--output", default="quant_config.json", help="JSON file to write (default: %(default)s)")
    g.add_argument("--quant-cfg", help="quant.cfg: when given it decides everything (as in AMCT)")
    g.add_argument("--skip-layers", type=_names,
                   help="comma-separated layers not to quantize")
    g.add_argument("--batch-num", type=_batch_count, default=1, help="calibration batches (default: 1)")
    g.add_argument("--no-activation-offset", action="store_true", help="symmetric activations (offset_d = 0)")
    _common(g)

    d = sub.add_parser("demo", help="quantize the bundled example model and print float vs int8 accuracy",
                       description="The main job on the bundled example (a small digits CNN with BN and a "
                                   "residual add): calibrate on its calibration split, then compare float "
                                   "and int8 accuracy on the held-out split.",
                       epilog=DEMO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("-o", "--output", default="amct_demo/lenet_digits", help="output path prefix (default: %(default)s)")
    d.add_argument("--batch-num", type=_batch_count, default=4, help="calibration batches (default: %(default)s)")
    d.add_argument("--device", default="auto", help="cpu or cuda (default: cuda if available)")
    _common(d)

    k = sub.add_parser("build-kernels", help="build and verify the compiled CPU kernels now",
                       description="Compile (or find in the private cache) the CPU calibration kernels, "
                                   "check them against the torch formulas, and say where they are. "
                                   "Calibration does this itself before its first batch; run it once in a "
                                   "Docker build step or before many parallel jobs.",
                       epilog=BUILD_KERNELS_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(k)
    from amct_torch.quality.evaluate import add_parser as add_evaluate
    add_allow_unknown_fields(add_evaluate(sub))  # amct_torch/quality/evaluate.py: its own options
    from amct_torch.workflow.inspect_model import add_parser as add_inspect
    add_inspect(sub)  # amct_torch/workflow/inspect_model.py: its own options
    _add_test(sub)
    return parser


TEST_EXAMPLES = """examples:
  # caffe test -model train_val.prototxt -weights w.caffemodel -iterations 100, without Caffe
  amct-torch test train_val.prototxt w.caffemodel --iterations 100

  # the float model and every quantized form calibrate wrote under out/model, side by side
  amct-torch calibrate train_val.prototxt w.caffemodel --output out/model --onnx
  amct-torch test train_val.prototxt w.caffemodel --quantized out/model --json
"""


def _add_test(sub: Any) -> argparse.ArgumentParser:
    """The ``test`` command's parser (``quality/net_scores.py`` runs it)."""
    p = sub.add_parser("test", epilog=TEST_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="caffe test: average the net's accuracy and loss over N batches of its "
                            "TEST data, float and quantized side by side",
                       description="N iterations of the TEST phase of a train/test net (its data "
                                   "layers' data, its metric and loss layers), every scalar output "
                                   "averaged as caffe test prints it; with --quantized, also each "
                                   "quantized form calibrate wrote under that prefix, with the drop.")
    p.add_argument("model", help="train_val or test prototxt (with data layers)")
    p.add_argument("weights", help="float caffemodel")
    p.add_argument("--iterations", type=_positive, default=50, help="batches (default: %(default)s, as caffe test)")
    p.add_argument("--quantized", metavar="PREFIX",
                   help="a calibrate --output prefix: also score its fake-quant and deploy Caffe "
                        "models and its QDQ ONNX model (ONNX Runtime)")
    p.add_argument("--ap-version", choices=("11point", "MaxIntegral", "Integral"), default="Integral",
                   help="how an SSD net's DetectionEvaluate output becomes its mAP, as the SSD "
                        "fork's solver ap_version (default: %(default)s, the fork's default; "
                        "VOC2007 nets use 11point)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    page = p.add_mutually_exclusive_group()
    page.add_argument("--report-html", metavar="PATH",
                      help="write the visual report (summary, float vs int8 accuracy) at PATH "
                           "(default with --quantized: PREFIX_test_report.html)")
    page.add_argument("--no-report", action="store_true", help="write no report page")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    _common(p)
    return p



def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.ERROR if args.quiet else (logging.INFO if args.verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("amct_torch").setLevel(level)


def _improvements(value: str) -> tuple:
    """``--improve``'s value: names from IMPROVEMENTS, comma-separated, or all."""
    from amct_torch.files.output_names import improvement_list
    try:
        return improvement_list(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _summary(result, out=None) -> None:
    out = out or sys.stdout
    qc = result.graph.config
    infos = {l.name: l for l in result.graph.layers}
    rows = []
    for name, r in result.records.items():
        cfg = qc.layers.get(name)
        algo = (cfg.act_algo if cfg is not None else "ifmr (joint)")
        nw = len(r.scale_w)
        weighted = infos.get(name) is not None and infos[name].weighted
        rows.append((name, algo, f"{r.scale_d:.6g}", str(r.offset_d),
                     "-" if not (nw and weighted) else ("per-tensor" if nw == 1 else f"{nw} channels")))
    head = ("layer", "act algo", "scale_d", "offset_d", "weights")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    used = ""
    if getattr(result, "samples_used", None) is not None:
        total = result.samples_total
        used = (f", {result.samples_used} sample(s)" if total is None else
                f", {result.samples_used} of {total} sample(s)")
    print(f"\nquantized {len(rows)} layer(s), {qc.batch_num} calibration batch(es){used} on "
          f"{result.device}", file=out)
    print(fmt.format(*head), file=out)
    for r in rows:
        print(fmt.format(*r), file=out)
    if "onnx" in result.files:  # the quantized layers ONNX Runtime runs in float, and why
        from amct_torch.export.onnx.ort_float import ort_float_layers
        per_channel = {n: len(r.scale_w) > 1 for n, r in result.records.items()}
        for name, why in ort_float_layers(result.float_model, per_channel):
            print(f"onnx: '{name}' runs in float in ONNX Runtime: {why}", file=out)
    imp = getattr(result, "improvement", None)
    if imp:  # what was kept, on how many rows, each stage's per-output gain ± error and cost
        from amct_torch.improve.pipeline import summary_line
        print(summary_line(imp), file=out)


def _print_report(result, rows: int) -> None:
    if result.report:
        from amct_torch.quality.report import format_table
        print("\nper-layer accuracy (fake-quant vs float output, worst first):")
        print(format_table(result.report, limit=rows))


def _print_files(files: dict) -> None:
    print("\nwritten:")
    width = max((len(k) for k in files), default=0)
    for kind, p in files.items():
        print(f"  {kind:<{width}}  {p}")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from amct_torch.runtime.malloc_tuning import keep_freed_memory
    from amct_torch.runtime.threads import prefer_passive_waits
    prefer_passive_waits()  # before torch loads: idle OpenMP threads sleep, not spin
    keep_freed_memory()  # this process only: each batch reuses the last one's activation memory
    if not args.distributed:  # the model is read while torch is imported (caffe/read_ahead.py)
        from amct_torch.caffe import read_ahead
        read_ahead.start(args.model, args.weights)
    if args.max_accuracy_drop is not None:
        return _calibrate_to_accuracy(args)
    from amct_torch.workflow import quantize

    pre = preprocess_from(args)
    onnx_only = [o for o, v in (("--onnx-activations", args.onnx_activations), ("--onnx-target", args.onnx_target),
                                ("--onnx-outputs", args.onnx_outputs),
                                ("--onnx-quantize-eltwise", args.onnx_quantize_eltwise)) if v]
    if onnx_only and not args.onnx:
        raise AmctError(f"{onnx_only[0]} shapes the ONNX model: add --onnx to write it")
    result = quantize(args.model, args.weights, args.data, preprocess=pre,
                      onnx=(args.onnx_activations or True) if args.onnx else False,
                      onnx_speed=args.onnx_quantize_eltwise, report=args.report_batches > 0,
                      report_batches=max(args.report_batches, 1), quiet=args.quiet,
                      onnx_target=args.onnx_target or ONNX_TARGETS[0],
                      activation_offset=not args.no_activation_offset,
                      **{f.name: getattr(args, f.name) for f in _option_fields()})
    if result.rank != 0:
        return 0
    _summary(result)
    _print_report(result, args.report_rows)
    _print_files(result.files)
    if getattr(result, "removed", None):
        print("\nremoved (an earlier run's files of this prefix that this run does not write):")
        for p in result.removed:
            print(f"  {p}")
    return 0


def _calibrate_to_accuracy(args: argparse.Namespace) -> int:
    """``calibrate --max-accuracy-drop``: AMCT's accuracy-based auto calibration judged by the
    net's own TEST data and Accuracy layer."""
    from amct_torch.config import create_quant_config
    from amct_torch.files.output_names import output_path
    from amct_torch.files.transaction import check_outputs, make_folder
    from amct_torch.quality.auto_calibration import accuracy_based_auto_calibration

    if args.data is not None:
        raise AmctError("--max-accuracy-drop judges the model on the net's own TEST data and Accuracy "
                        "layer: leave DATA out", file=args.data)
    if not args.max_accuracy_drop >= 0:
        raise AmctError(f"--max-accuracy-drop must be >= 0 points, got {args.max_accuracy_drop}")
    for p, what in ((args.model, "model file"), (args.weights, "weights file")):
        if not os.path.isfile(p):
            raise AmctError(f"{what} not found", file=p)
    config, record = output_path(args.output, "config"), output_path(args.output, "record")
    check_outputs([config, record], [args.model, args.weights, args.config])
    make_folder(os.path.dirname(os.path.abspath(args.output)))
    if args.config is not None and args.config.lower().endswith(".json"):
        config = args.config
    else:
        create_quant_config(config, args.model, args.weights, skip_layers=args.skip_layers,
                            batch_num=args.batch_num or 1, activation_offset=not args.no_activation_offset,
                            config_defination=args.config)
    res = accuracy_based_auto_calibration(args.model, args.weights, None, config, record, args.output,
                                          max_accuracy_drop=args.max_accuracy_drop, iterations=args.iterations,
                                          device=args.device, quiet=args.quiet)
    print(f"\naccuracy: float {res.original_metric:.6g}, int8 {res.final_metric:.6g} "
          f"(drop {100 * (res.original_metric - res.final_metric):.3g} points, allowed {args.max_accuracy_drop:g})")
    print(f"left in float: {', '.join(res.float_layers) if res.float_layers else 'none'}")
    _print_files(res.files)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from amct_torch.api import convert_model
    from amct_torch.errors import ModelError, RecordError
    from amct_torch.inputs.limits import check_regular_file
    for p, what, err in ((args.model, "model file", ModelError), (args.weights, "weights file", ModelError),
                         (args.record, "record file", RecordError)):
        check_regular_file(p, what, err)
    written = convert_model(args.model, args.weights, args.record, args.output)
    _print_files({os.path.basename(p): p for p in written})
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from amct_torch.config import create_quant_config
    from amct_torch.files.transaction import check_output_name, check_outputs, make_folder
    check_output_name(args.output, "--output")
    if args.quant_cfg and (args.skip_layers or args.no_activation_offset):
        given = "--skip-layers" if args.skip_layers else "--no-activation-offset"
        raise AmctError(f"{given} applies only without --quant-cfg: the quant.cfg decides "
                        "everything (as in AMCT); put it in the quant.cfg", file=args.quant_cfg)
    check_outputs([args.output], [args.model, args.weights, args.quant_cfg])
    make_folder(os.path.dirname(os.path.abspath(args.output)))
    create_quant_config(args.output, args.model, args.weights, skip_layers=args.skip_layers,
                        batch_num=args.batch_num, activation_offset=not args.no_activation_offset,
                        config_defination=args.quant_cfg)
    print(f"wrote {args.output}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from amct_torch.workflow.demo import run_demo
    return run_demo(output=args.output, batch_num=args.batch_num, device=args.device,
                    quiet=args.quiet)


def cmd_build_kernels(args: argparse.Namespace) -> int:
    from amct_torch import kernels
    from amct_torch.kernels import native
    lib = native.library()
    if lib is None:
        print(f"CPU kernels unavailable: {kernels.unavailable_reason()}; calibration uses the torch formulas")
        return 0 if kernels.turned_off() else 1
    print(f"CPU kernels ready: {lib._amct_path}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from amct_torch.quality.evaluate import cmd_evaluate as run
    return run(args)


def cmd_test(args: argparse.Namespace) -> int:
    from amct_torch.runtime.malloc_tuning import keep_freed_memory
    from amct_torch.runtime.threads import prefer_passive_waits
    prefer_passive_waits()  # before torch loads: idle OpenMP threads sleep while the decoders run
    keep_freed_memory()  # each batch reuses the last one's activation memory
    from amct_torch.quality.net_scores import cmd_test as run
    return run(args)


def cmd_inspect(args: argparse.Namespace) -> int:
    from amct_torch.workflow.inspect_model import cmd_inspect as run
    return run(args)


COMMANDS = {"calibrate": cmd_calibrate, "convert": cmd_convert, "config": cmd_config, "demo": cmd_demo,
            "build-kernels": cmd_build_kernels, "evaluate": cmd_evaluate, "inspect": cmd_inspect,
            "test": cmd_test}


def _inputs_of(args: argparse.Namespace) -> str:
    """The input files of a command line, for an error that cannot name the one at fault."""
    names = [getattr(args, k, None) for k in ("model", "weights", "data", "record", "config",
                                               "quant_cfg")]
    present = [str(n) for n in names if n]
    return f"{', '.join(present)}: " if present else ""


#: errors of writing (a full disk, a quota, a read-only mount): they concern the output
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def _os_error_line(err: OSError, args: argparse.Namespace) -> str:
    """The one line of an ``OSError`` that reached the command: the file it names (the user's
    output for a private temporary or staging path), else for a write error the command's
    output, else its inputs; and the reason in plain words."""
    from amct_torch.files.transaction import user_path, write_error
    output = getattr(args, "output", None)
    if isinstance(err.filename, str):
        where = user_path(err.filename)
    elif err.errno in _WRITE_ERRNOS and output:
        where = output
    else:
        where = None
    if err.errno in _WRITE_ERRNOS or (where is not None and where != err.filename):
        return str(write_error(err, where))
    why = excerpt(err.strerror or str(err) or type(err).__name__)
    return f"{where}: {why}" if where else f"{_inputs_of(args)}{why}"


def _forgiving_streams() -> None:
    """Standard output and error never fail on a character their encoding lacks (a unicode
    prefix under ``LANG=C``): it is written escaped (``\\u00e9``), and a finished job stays
    finished."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    As the installed command (``argv`` None) it ends the process itself once the command is
    done: everything it writes is committed and flushed by then, and the ordinary shutdown of
    a process holding torch and the models (module teardown, garbage collection) took
    0.6-1.1 s of a 5 s calibration job. ``AMCT_TORCH_FAST_EXIT=0`` keeps the ordinary exit."""
    code = _run(argv)
    if argv is None and os.environ.get("AMCT_TORCH_FAST_EXIT", "1") != "0":
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Flush what the command printed or logged and end the process (not under
    torch.distributed, whose peers expect an orderly shutdown)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _run(argv: Optional[Sequence[str]]) -> int:
    _forgiving_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    _setup_logging(args)
    from amct_torch.caffe.unknown_fields import unknown_fields_allowed
    try:
        with unknown_fields_allowed(bool(getattr(args, "allow_unknown_fields", False))):
            return COMMANDS[args.command](args)
    except AmctError as err:
        msg = " ".join(str(err).split())
        print(f"amct-torch {args.command}: error: {msg}", file=sys.stderr)
    except OSError as err:
        print(f"amct-torch {args.command}: error: {_os_error_line(err, args)}", file=sys.stderr)
    except (MemoryError, RecursionError) as err:
        # resource exhaustion reached from a user's file: one line naming the command's inputs
        where = _inputs_of(args)
        why = str(err) or type(err).__name__
        if isinstance(err, (MemoryError, RecursionError)):
            why = f"{type(err).__name__}: {why}" if str(err) else type(err).__name__
        print(f"amct-torch {args.command}: error: {where}{excerpt(why)}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"amct-torch {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:  # SIGTERM/SIGHUP while writing: the staging folder goes
        abort_open()  # (one the signal cut short before its caller's own cleanup too)
        done = "the outputs were committed first" if stop.committed else "no output was written"
        print(f"amct-torch {args.command}: terminated by signal {stop.signum}; {done}", file=sys.stderr)
        return 128 + stop.signum  # the shell's status for a signal, as the process would exit
    return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
