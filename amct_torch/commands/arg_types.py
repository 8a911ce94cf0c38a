"""The command line's value types: text to value, or an argparse error naming what was expected.

Declarations name them (``flag("--batch-num", type="positive")``, ``TYPES``) so that the
options can be declared without argparse; argparse turns the error into exit 2.
"""
from __future__ import annotations

import argparse
from typing import Callable


def _int_at_least(text: str, low: int, what: str) -> int:
    """``text`` as an integer >= ``low``, else an argument error saying ``what`` was expected."""
    try:
        v = int(text)
    except ValueError:
        v = low - 1
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def positive(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def batch_count(text: str) -> int:
    """A batch count in [1, MAX_BATCH_NUM]: an absurd one is refused here, not after the model
    is read (it overflowed the config's 32-bit field)."""
    from amct_torch.inputs import MAX_BATCH_NUM
    v = positive(text)
    if v > MAX_BATCH_NUM:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH_NUM} batches, got {text!r}")
    return v


def names(text: str) -> list[str]:
    """A comma-separated list of names (empty items dropped)."""
    return [x for x in text.split(",") if x]


def improvements(value: str) -> tuple:
    """``--improve``'s value: names from IMPROVEMENTS, comma-separated, or all."""
    from amct_torch.improve import improvement_list
    try:
        return improvement_list(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: the types a declaration names
TYPES: dict[str, Callable[[str], object]] = {
    "positive": positive, "non_negative": non_negative, "batch_count": batch_count, "names": names,
    "improvements": improvements}
