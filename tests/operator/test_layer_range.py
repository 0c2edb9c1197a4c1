"""One BEGIN:END parser for every command that takes layer ranges."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from meshnet.api.shardroute import LayerRange
from meshnet.cli.main import cli


def test_parse_round_trips_and_refuses_with_the_form() -> None:
    assert LayerRange.parse("0:15") == LayerRange(0, 15)
    assert str(LayerRange.parse(" 15:30 ")) == "15:30"
    for bad in ("15", "a:b", "-1:3", "0:", ":4", "0:5000"):
        with pytest.raises(ValueError, match=r"BEGIN:END|0\.\.4096"):
            LayerRange.parse(bad)


def test_worker_run_names_the_form(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    ran = CliRunner().invoke(cli, ["worker", "run", "--model", str(model), "--layers", "7"])
    assert ran.exit_code == 2 and "BEGIN:END" in ran.output, ran.output
