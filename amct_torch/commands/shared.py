"""What several commands share, declared once: a ``QuantizeOptions`` field as arguments
(``add_field``: ``--device``, ``-o/--output``, ``--batch-num``, ``--skip-layers``,
``--no-activation-offset``, ``--allow-unknown-fields``, ``-q``), ``-v``, the MODEL WEIGHTS pair
and a parser with examples; and the job options read back from ``calibrate``'s arguments.
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields
from typing import Any

from amct_torch.commands.arg_types import TYPES
from amct_torch.errors import AmctError
from amct_torch.workflow import QuantizeOptions, dest_of, flags_of, read_value


def option_field(name: str) -> Field:
    """The ``QuantizeOptions`` field ``name``."""
    return next(f for f in fields(QuantizeOptions) if f.name == name)


def command_fields() -> list[Field]:
    """The fields ``calibrate`` reads from its arguments, in declaration order (a field with
    ``read`` alone reads another field's flag)."""
    return [f for f in fields(QuantizeOptions) if f.metadata["cli"] or f.metadata["read"]]


def add_field(p: argparse.ArgumentParser, name: str, **overrides: Any) -> None:
    """The arguments of the field ``name`` as declared; ``overrides``: argparse keywords of its
    first flag that differ for this command (its default, help, type)."""
    f = option_field(name)
    cli = f.metadata["cli"]
    if callable(cli):  # a group declared with its own module
        cli(p)
        return
    for i, fl in enumerate(flags_of(f)):
        kw = dict(fl.keywords, **(overrides if i == 0 else {}))
        if isinstance(kw.get("type"), str):
            kw["type"] = TYPES[kw["type"]]
        kw.setdefault("help", f.metadata["help"])
        if fl.positional:
            p.add_argument(fl.spellings[0], **kw)
            continue
        if i == 0 and f.default is not MISSING:
            kw.setdefault("default", f.default)
        kw.setdefault("dest", dest_of(f, i))
        p.add_argument(*fl.spellings, **kw)


def add_logging(p: argparse.ArgumentParser) -> None:
    """``-q`` (no progress bar; warnings still shown) and ``-v`` (each step logged)."""
    add_field(p, "quiet")
    p.add_argument("-v", "--verbose", action="store_true", help="log each step too (INFO)")


def model_command(sub: Any, name: str, examples: str, **texts: str) -> argparse.ArgumentParser:
    """A command that reads a Caffe model: its parser (``texts``: help and description;
    ``examples`` after the options, as written) with MODEL and WEIGHTS first."""
    p = command(sub, name, examples, **texts)
    add_field(p, "model_file")
    add_field(p, "weights_file")
    return p


def command(sub: Any, name: str, examples: str, **texts: str) -> argparse.ArgumentParser:
    """A command's parser with its examples after the options, as written."""
    return sub.add_parser(name, epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter, **texts)


def option_values(args: argparse.Namespace) -> dict:
    """The job options ``calibrate``'s parsed ``args`` give, by field; a flag that shapes what
    another writes (``Flag.needs``) is refused without that one."""
    cli = command_fields()
    values = {f.name: read_value(f, args) for f in cli}
    for f in cli:
        for i, fl in enumerate(flags_of(f)):
            if fl.needs and getattr(args, dest_of(f, i)) and not values[fl.needs]:
                need = flags_of(option_field(fl.needs))[0].name
                raise AmctError(f"{fl.name} shapes what {need} writes: add {need} to write it")
    return values
