"""The image preprocessing options of the command line, defined once for every command that
reads images (``calibrate``, ``evaluate``): Caffe's ``transform_param`` knobs.

Why one definition: a model evaluated with other preprocessing than it was calibrated with
gives meaningless numbers, so the commands must take the same options with the same meaning.
Torch-free: ``--help`` builds these parsers without loading torch.
"""
from __future__ import annotations

import argparse
from typing import Any


def floats(text: str) -> list[float]:
    """Numbers separated by commas (``--mean 104,117,123``)."""
    try:
        vals = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def sizes(text: str) -> list[int]:
    """One or two positive sizes (``224``, ``256,256``, ``256x256``)."""
    try:
        vals = [int(v) for v in text.lower().replace("x", ",").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 224 or 256,256, got {text!r}") from None
    if len(vals) not in (1, 2) or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected one or two positive sizes, got {text!r}")
    return vals


def add_preprocess_options(p: argparse.ArgumentParser) -> None:
    """``--channel-order``, ``--mean``, ``--scale``, ``--resize``, ``--crop`` on ``p``."""
    p.add_argument("--channel-order", choices=("bgr", "rgb"), default="bgr",
                   help="image channel order (default: bgr, as Caffe)")
    p.add_argument("--mean", type=floats,
                   help="mean subtracted per channel, e.g. 104,117,123 (in the final channel order)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplier after mean subtraction (default: 1)")
    p.add_argument("--resize", type=sizes, help="resize images: H,W, or one number for the shorter side "
                                                "(default: the net's input size when no --crop)")
    p.add_argument("--crop", type=sizes, help="centre crop H,W or one number for a square")


def preprocess_from(args: argparse.Namespace) -> Any:
    """The ``Preprocess`` of the parsed options (``add_preprocess_options``)."""
    from amct_torch.inputs.data import Preprocess
    return Preprocess(channel_order=args.channel_order, mean=args.mean, scale=args.scale,
                      resize=args.resize, crop=args.crop)
