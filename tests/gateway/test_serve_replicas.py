"""`meshnet serve` is told where a route's replicas are in exactly one way."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from meshnet.cli.serve import command
from meshnet.gateway.routes import fixed_replicas


@pytest.mark.parametrize("args", [
    [],
    ["--stage", "a:1", "--replica", "a:1,b:2"],
    ["--route", "r", "--scaled-to-zero"],
    ["--replica", "a:1,,b:2"],
], ids=["none", "stage-and-replica", "route-and-zero", "empty-endpoint"])
def test_serve_refuses_replicas_given_in_no_way_or_in_two(args: list[str]) -> None:
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2, result.output
    assert "--replica" in result.output


def test_replicas_are_labelled_by_their_position_with_their_stages_in_order() -> None:
    assert fixed_replicas([["a:1", "b:2"], ["c:3", "d:4"]])() == {
        "0": ("a:1", "b:2"), "1": ("c:3", "d:4")}
    assert fixed_replicas([])() == {}
