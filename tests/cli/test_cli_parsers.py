"""Each subcommand's parser (``amct_torch/commands/``): its ``--help`` prints with examples, the
options several commands share parse to the same value in each, and ``-q`` hides the progress
bar but not the warnings (``-v`` adds each step)."""
from __future__ import annotations

import argparse
import logging

import numpy as np
import pytest

from amct_torch.cli import COMMANDS, build_parser, main
from amct_torch.workflow.examples import example_data, example_model


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_help_prints_its_usage_and_examples(command, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith(f"usage: amct-torch {command} ") and f"amct-torch {command}" in out.split("\nexamples:\n")[1]


def test_the_command_list_is_the_parsers():
    assert sorted(_subparsers()) == sorted(COMMANDS)


# (command and its own positional arguments) for each command that takes the shared option
SHARED = {
    "--skip-layers": (["calibrate", "m", "w", "d"], ["config", "m", "w"]),
    "--no-activation-offset": (["calibrate", "m", "w", "d"], ["config", "m", "w"]),
    "--batch-num": (["calibrate", "m", "w", "d"], ["config", "m", "w"], ["demo"]),
    "--device": (["calibrate", "m", "w", "d"], ["demo"], ["evaluate", "m", "w", "d"], ["test", "m", "w"]),
    "--output": (["calibrate", "m", "w", "d"], ["convert", "m", "w", "r"], ["config", "m", "w"], ["demo"]),
    "--allow-unknown-fields": (["calibrate", "m", "w", "d"], ["convert", "m", "w", "r"], ["config", "m", "w"],
                               ["evaluate", "m", "w", "d"], ["inspect", "m"]),
    "--quiet": tuple([c] + ["m", "w", "d"] for c in ("calibrate", "evaluate")) + (["demo"], ["build-kernels"]),
}
GIVEN = {"--skip-layers": (["a,,b"], "skip_layers", ["a", "b"]), "--no-activation-offset": ([], "activation_offset", False),
         "--batch-num": (["3"], "batch_num", 3), "--device": (["cpu"], "device", "cpu"),
         "--output": (["x/y"], "output", "x/y"), "--allow-unknown-fields": ([], "allow_unknown_fields", True),
         "--quiet": ([], "quiet", True)}


@pytest.mark.parametrize("option", sorted(SHARED))
def test_a_shared_option_parses_the_same_in_every_command(option):
    value, dest, want = GIVEN[option]
    for argv in SHARED[option]:
        args = build_parser().parse_args([*argv, option, *value])
        assert getattr(args, dest) == want, argv
        assert getattr(build_parser().parse_args(argv), dest) != want, argv


def test_batch_counts_beyond_the_config_field_are_refused_by_config_and_demo(capsys):
    for argv in (["config", "m", "w"], ["demo"]):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*argv, "--batch-num", "4294967296"])
        assert done.value.code == 2 and "at most" in capsys.readouterr().err


@pytest.fixture()
def example_arrays(tmp_path):
    proto, weights = example_model()
    x, _ = example_data("calib")
    data = tmp_path / "calib.npy"
    np.save(data, x[:24])
    return proto, weights, str(data)


@pytest.mark.parametrize("flag, steps", [("-q", False), ("-v", True)])
def test_quiet_still_logs_warnings_and_verbose_each_step(tmp_path, example_arrays, caplog, flag, steps):
    proto, weights, data = example_arrays
    # 1 batch of 8 of the 24 samples: the job warns that 16 samples are left unused
    code = main(["calibrate", proto, weights, data, "--batch-num", "1", "--batch-size", "8", "--report-batches", "0",
                 "--device", "cpu", "-o", str(tmp_path / "out" / "m"), flag])
    assert code == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("calibrated on 8 of 24 samples" in m for m in warned), warned
    assert any(r.levelno == logging.INFO for r in caplog.records) == steps
