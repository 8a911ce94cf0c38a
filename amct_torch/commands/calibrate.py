"""``amct-torch calibrate``: the one-call job from the command line. Its job options are the
``QuantizeOptions`` fields' own arguments (``workflow/options.py``); the ones declared here
only shape what the command prints or choose the accuracy-driven mode.
"""
from __future__ import annotations

import argparse
import os
import textwrap
from typing import Any

from amct_torch.commands.arg_types import non_negative, positive
from amct_torch.commands.printing import print_files, print_report, print_summary
from amct_torch.commands.shared import add_field, add_logging, command, command_fields, option_values
from amct_torch.errors import AmctError
from amct_torch.export import prefix_suffixes
from amct_torch.workflow import flags_of

EXAMPLES = """examples:
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


def add_parser(sub: Any) -> argparse.ArgumentParser:
    c = command(sub, "calibrate", EXAMPLES,
                help="calibrate a Caffe model on data and write the quantized models",
                description="Fuse BN, quantize weights (ARQ) and calibrate activations "
                            "(IFMR/HFMG) on your data; write the record and the models.")
    for f in command_fields():
        if f.name != "quiet":  # with -v, last
            add_field(c, f.name)
    c.add_argument("--report-rows", type=non_negative, default=15,
                   help="rows of the per-layer table printed (default: %(default)s)")
    c.add_argument("--max-accuracy-drop", type=float, metavar="POINTS",
                   help="accuracy-driven calibration of a train/test net with an Accuracy layer (no "
                        "DATA: its own TEST data): keep the fewest most sensitive layers in float so "
                        "that the int8 model loses at most POINTS percentage points of accuracy")
    c.add_argument("--iterations", type=positive, default=50,
                   help="with --max-accuracy-drop: batches each accuracy is averaged over (default: "
                        "%(default)s, as caffe test)")
    add_logging(c)
    return c


def run(args: argparse.Namespace) -> int:
    from amct_torch.runtime import keep_freed_memory, prefer_passive_waits
    prefer_passive_waits()  # before torch loads: idle OpenMP threads sleep, not spin
    keep_freed_memory()  # this process only: each batch reuses the last one's activation memory
    if not args.distributed:  # the model is read while torch is imported (caffe/read_ahead.py)
        from amct_torch.caffe import read_ahead
        read_ahead.start(args.model, args.weights)
    options = option_values(args)
    if args.max_accuracy_drop is not None:
        return _calibrate_to_accuracy(args, options)
    from amct_torch.workflow import quantize

    result = quantize(**options)
    if result.rank != 0:
        return 0
    print_summary(result)
    print_report(result, args.report_rows)
    print_files(result.files)
    if getattr(result, "removed", None):
        print("\nremoved (an earlier run's files of this prefix that this run does not write):")
        for p in result.removed:
            print(f"  {p}")
    return 0


#: the job options ``calibrate --max-accuracy-drop`` reads; any other one given is refused
_ACCURACY_SEARCH_FIELDS = frozenset({"model_file", "weights_file", "calibration_data", "config", "output", "batch_num",
                                     "skip_layers", "activation_offset", "device", "quiet", "report"})


def _ignored_by_accuracy_search(args: argparse.Namespace, options: dict) -> list[str]:
    """The options given (other than their defaults) that the accuracy search would drop,
    each by its first flag (or its field name: the preprocessing group)."""
    defaults = option_values(add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([args.model,
                                                                                              args.weights]))
    return [(flags_of(f)[0].name if flags_of(f) else f.name) for f in command_fields()
            if f.name not in _ACCURACY_SEARCH_FIELDS and options[f.name] != defaults[f.name]]


def _calibrate_to_accuracy(args: argparse.Namespace, options: dict) -> int:
    """``calibrate --max-accuracy-drop``: AMCT's accuracy-based auto calibration judged by the
    net's own TEST data and Accuracy layer. Every file is staged and committed together: a run
    that fails (a net without an Accuracy layer, a bad config) publishes none."""
    from amct_torch.config import create_quant_config
    from amct_torch.files import OutputTransaction, output_path
    from amct_torch.quality import accuracy_based_auto_calibration

    if args.data is not None:
        raise AmctError("--max-accuracy-drop judges the model on the net's own TEST data and Accuracy "
                        "layer: leave DATA out", file=args.data)
    if not args.max_accuracy_drop >= 0:
        raise AmctError(f"--max-accuracy-drop must be >= 0 points, got {args.max_accuracy_drop}")
    ignored = _ignored_by_accuracy_search(args, options)
    if ignored:
        raise AmctError(f"--max-accuracy-drop does not read {', '.join(ignored)}: it writes the record, the "
                        "quant config and both Caffe models from the net's own TEST data; leave them out")
    for p, what in ((args.model, "model file"), (args.weights, "weights file")):
        if not os.path.isfile(p):
            raise AmctError(f"{what} not found", file=p)
    prefix, quant_cfg = options["output"], options["config"]
    config, record = output_path(prefix, "config"), output_path(prefix, "record")
    with OutputTransaction([config, record], [args.model, args.weights, quant_cfg],
                           name=os.path.basename(prefix)) as tx:
        if quant_cfg is not None and quant_cfg.lower().endswith(".json"):
            used, written = quant_cfg, []
        else:
            used, written = tx.staged(config), [config]
            create_quant_config(used, args.model, args.weights, skip_layers=options["skip_layers"],
                                batch_num=options["batch_num"] or 1, activation_offset=options["activation_offset"],
                                config_defination=quant_cfg)
        res = accuracy_based_auto_calibration(args.model, args.weights, None, used, tx.staged(record),
                                              tx.staged_prefix(prefix), max_accuracy_drop=args.max_accuracy_drop,
                                              iterations=args.iterations, device=options["device"],
                                              quiet=options["quiet"])
        files = {k: tx.final_of(p) for k, p in res.files.items()}
        tx.commit(written + list(files.values()))
    print(f"\naccuracy: float {res.original_metric:.6g}, int8 {res.final_metric:.6g} "
          f"(drop {100 * (res.original_metric - res.final_metric):.3g} points, allowed {args.max_accuracy_drop:g})")
    print(f"left in float: {', '.join(res.float_layers) if res.float_layers else 'none'}")
    print_files(files)
    return 0
