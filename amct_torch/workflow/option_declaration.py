"""How one job option is declared: ``option(default, help, arg, cli, read)``, one dataclass field
that holds its default, its help, its argument check and its ``calibrate`` arguments (``Flag``).

Why here: ``quantize``'s argument checks and docstring, the ``calibrate`` arguments and the
docs tables are all read from these declarations, so that an option is written down once.
Torch-free and argparse-free: the command line turns ``Flag`` into arguments (``commands/``).
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field
from typing import Any, Callable, Optional, Union

#: adds a field's arguments to a parser when they are declared elsewhere (a group of options
#: that other commands take too, such as the image preprocessing)
AddArguments = Callable[[Any], None]


@dataclass(frozen=True)
class Flag:
    """One command-line argument of a field: its ``spellings`` (a name for a positional) and
    argparse keywords, ``type`` by name (``commands/arg_types.py``) and ``help`` the field's
    unless given. The dest of a field's first option is the field's name. ``needs``: the field
    whose argument must be given too (this one shapes what that one writes)."""

    spellings: tuple[str, ...]
    keywords: Mapping[str, Any]
    needs: Optional[str] = None

    @property
    def positional(self) -> bool:
        return not self.spellings[0].startswith("-")

    @property
    def name(self) -> str:
        """How the user spells it: its longest option string, or a positional in capitals."""
        return self.spellings[0].upper() if self.positional else max(self.spellings, key=len)


def flag(*spellings: str, needs: Optional[str] = None, **keywords: Any) -> Flag:
    """A ``Flag`` (``keywords``: argparse's, with ``type`` by name)."""
    return Flag(spellings, keywords, needs)


def option(default: Any, help: str, arg: Any = None,
           cli: Union[None, Flag, tuple[Flag, ...], AddArguments] = None,
           read: Optional[Callable[[Any], Any]] = None) -> Any:
    """A ``QuantizeOptions`` field declared once: its default (``MISSING``: required), its
    ``help`` (the API's, and the command's unless a flag says otherwise), ``arg`` (what the
    value must be: an ``amct_torch.arguments`` check), ``cli`` (its ``calibrate`` arguments:
    ``Flag``\\ s, or a function adding a group declared elsewhere) and ``read`` (the field's
    value from the parsed arguments; default: its first flag's value)."""
    if isinstance(arg, Flag):  # a flag in the check's place: the field would have no check
        raise TypeError("option(): pass the flags as cli=, after the argument check")
    flags = (cli,) if isinstance(cli, Flag) else cli
    meta = {"help": help, "arg": arg, "cli": flags, "read": read}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def flags_of(f: Field) -> tuple[Flag, ...]:
    """The field's ``Flag``\\ s (none when it has no argument or adds a group)."""
    cli = f.metadata.get("cli")
    return cli if isinstance(cli, tuple) else ()


def dest_of(f: Field, i: int = 0) -> str:
    """Where argparse puts the value of the field's ``i``-th flag."""
    fl = flags_of(f)[i]
    if "dest" in fl.keywords:
        return str(fl.keywords["dest"])
    if fl.positional:
        return fl.spellings[0]
    return f.name if i == 0 else max(fl.spellings, key=len).lstrip("-").replace("-", "_")


def read_value(f: Field, args: Any) -> Any:
    """The field's value from the parsed arguments ``args``."""
    read = f.metadata.get("read")
    return read(args) if read is not None else getattr(args, dest_of(f))


def help_text(f: Field) -> str:
    """The field's help with its default written in (``%(default)s``)."""
    text = f.metadata["help"]
    return text.replace("%(default)s", str(f.default)) if "%(default)s" in text else text


def arguments_doc(fs: tuple[Field, ...]) -> str:
    """The arguments paragraph of a docstring: one ````name````: help entry per field."""
    return "\n".join(textwrap.fill(f"``{f.name}``: {help_text(f)}", width=96, initial_indent="    ",
                                   subsequent_indent="        ", break_on_hyphens=False) for f in fs)
