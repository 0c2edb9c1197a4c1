"""Ranges that are empty, reversed or outside the model, and splits that do not cover the
model contiguously, are refused with a clear error before anything loads - never a crash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.parity import ParityError, parse_split, run_parity
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace

BAD_SPLITS = {
    "0:15,15:15,15:30": "layer range 15:15 is empty",
    "0:15,20:15": "layer range 20:15 is reversed",
    "0:15,15:31": "layer range 15:31 is outside the model's layers 0:30",
    "0:10,12:30": "layers 10:12 are missing",
    "0:16,15:30": "layers 15:16 overlap",
    "0:29": "layers 29:30 are missing at the end",
    "1:30": "layers 0:1 are missing",
    "15:30,0:15": "does not cover the model contiguously",
}


def run_tool(tool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize(("split", "reason"), BAD_SPLITS.items())
def test_the_tool_refuses_a_bad_split_before_loading(
    parity_tool: Path, smollm2: Path, split: str, reason: str,
) -> None:
    proc = run_tool(parity_tool, "--model", str(smollm2), "--split", split)
    assert proc.returncode == 2  # refused: not a crash (negative) and not a parity failure (1)
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert reason in report["error"]
    assert reason in proc.stderr


@pytest.mark.parametrize("split", ["", "a:b", "-1:15,15:30", "0:15;15:30", "0-15", "0:15,"])
def test_the_tool_refuses_malformed_splits(parity_tool: Path, smollm2: Path, split: str) -> None:
    proc = run_tool(parity_tool, "--model", str(smollm2), "--split", split)
    assert proc.returncode == 2
    assert "BEGIN:END" in json.loads(proc.stdout)["error"]


def test_the_tool_refuses_a_file_that_is_not_a_gguf(parity_tool: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf at all")
    proc = run_tool(parity_tool, "--model", str(bogus), "--split", "0:1")
    assert proc.returncode == 2
    assert "cannot read a GGUF header" in json.loads(proc.stdout)["error"]


def test_run_parity_raises_the_tools_reason(parity_tool: Path, smollm2: Path) -> None:
    with pytest.raises(ParityError, match="layer range 20:15 is reversed"):
        run_parity(smollm2, ["0:15,20:15"], Workspace(workspace()))


def test_malformed_splits_are_refused_before_running_anything() -> None:
    assert [str(r) for r in parse_split("0:7,7:8,8:30")] == ["0:7", "7:8", "8:30"]
    for split in ["0:15;15:30", "0:15,", "a:b", "-1:5", "3"]:
        with pytest.raises(ParityError, match="BEGIN:END"):
            parse_split(split)


def meshnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshnet.cli", *args], capture_output=True,
                          text=True, timeout=600, check=False)


def test_meshnet_parity_reports_a_refused_split_and_exits_1(
    parity_tool: Path, smollm2: Path,
) -> None:
    proc = meshnet("parity", "--model", str(smollm2), "--split", "0:10,12:30")
    assert proc.returncode == 1
    assert "layers 10:12 are missing" in proc.stderr
    assert "Traceback" not in proc.stderr
