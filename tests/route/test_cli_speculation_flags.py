"""`meshnet generate` and `meshnet serve` take the verify windows beside the draft length,
within the driver's bounds."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from meshnet.cli import generate, serve

COMMANDS = {"generate": (generate.command, ["--stage", "127.0.0.1:1", "--prompt", "x"]),
            "serve": (serve.command, ["--stage", "127.0.0.1:1"])}


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("windows", ["0", "9"])
def test_windows_in_flight_are_1_to_8(name: str, windows: str) -> None:
    command, args = COMMANDS[name]
    result = CliRunner().invoke(command, [*args, "--speculate", "4", "--windows", windows])
    assert result.exit_code == 2
    assert f"{windows} is not in the range 1<=x<=8" in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_help_says_what_windows_are_and_that_a_hub_keeps_one(name: str) -> None:
    command: click.Command = COMMANDS[name][0]
    text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
    assert "--windows INTEGER RANGE" in text and "a hub keeps one" in text
    assert "[default: 1; 1<=x<=8]" in text
