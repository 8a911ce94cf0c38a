"""The ``amct-torch`` command: calibrate a Caffe model, convert a record, write a quant config,
evaluate, inspect or test a model, or run the demo on the bundled example.

Each subcommand is a module of ``amct_torch.commands`` (its parser and its run); this module
builds the parser from them and runs one. Every user error (AmctError, missing or unreadable
files, bad arguments) prints one line and exits with code 2; nothing is left half-written
(the API writes through temporary files).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Optional

from amct_torch.errors import AmctError, excerpt
from amct_torch.files.transaction import Terminated, abort_open

log = logging.getLogger("amct_torch")

EXIT_USER_ERROR = 2

#: the subcommands, as ``--help`` lists them (command -> module of ``amct_torch.commands``)
COMMANDS = {"calibrate": "calibrate", "convert": "convert", "config": "config", "demo": "demo",
            "build-kernels": "build_kernels", "evaluate": "evaluate", "inspect": "inspect", "test": "test"}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (exit code 2, no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: each subcommand's own (``commands/<name>.py``), its ``run`` the
    parsed arguments' ``run``."""
    parser = _Parser(prog="amct-torch",
                     description="Post-training 8-bit quantization of Caffe models with PyTorch "
                                 "(AMCT-compatible record, fake-quant and deploy models).",
                     epilog="run 'amct-torch demo' to see it work on the bundled example model; "
                            "'amct-torch COMMAND --help' for each command's options and examples",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from amct_torch import __version__
    parser.add_argument("--version", action="version", version=f"amct-torch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS.values():
        command = importlib.import_module(f"amct_torch.commands.{module}")
        command.add_parser(sub).set_defaults(run=command.run)
    return parser


def _setup_logging(args: argparse.Namespace) -> None:
    """Warnings and errors always (``-q`` only hides the progress bar); each step with ``-v``."""
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("amct_torch").setLevel(level)


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
            return args.run(args)
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
