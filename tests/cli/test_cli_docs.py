"""docs/cli.md holds one table per command that lists exactly that command's arguments and
options, with their defaults: read against the real argparse parsers, so the docs cannot drift."""
import argparse
import re
from pathlib import Path

import pytest

from amct_torch.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("amct-torch has no subcommands")


def _documented() -> dict[str, dict[str, str]]:
    """Command -> {argument or option spelling: the row's default cell}, from the tables under
    the ``## `amct-torch COMMAND ...``` headings."""
    tables: dict[str, dict[str, str]] = {}
    command = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## `amct-torch ([a-z-]+)", line)
        if heading:
            command = heading.group(1)
            tables[command] = {}
        elif line.startswith("## "):
            command = None
        elif command and line.startswith("| ") and not line.startswith("| option ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for name in re.findall(r"`([^`]+)`", cells[0]):
                tables[command][name] = cells[1]
    return tables


def _spellings(action: argparse.Action) -> list[str]:
    """How the docs name an argument: its option strings, or a positional's name in capitals."""
    return list(action.option_strings) or [action.dest.upper()]


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_of_the_command_is_in_its_table(command):
    parser = _subparsers()[command]
    table = _documented().get(command)
    assert table is not None, f"docs/cli.md has no table for 'amct-torch {command}'"
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    wanted = {name for a in actions for name in _spellings(a)}
    assert sorted(wanted - set(table)) == [], f"'{command}' options missing from docs/cli.md"
    assert sorted(set(table) - wanted) == [], f"docs/cli.md lists options '{command}' does not have"
    for action in actions:
        default = action.default
        if default is None or isinstance(default, bool) or default == argparse.SUPPRESS:
            continue  # "none"/"off", or a default the docs describe in words
        cell = table[_spellings(action)[0]]
        assert f"`{default}`" in cell, f"{command} {_spellings(action)[0]}: default {default!r}, docs say {cell!r}"


def test_the_docs_have_no_table_for_a_command_that_does_not_exist():
    assert sorted(set(_documented()) - set(_subparsers())) == []
