"""`meshnet parity` wraps the tool: JSON on request, a readable summary otherwise, and a
non-zero exit when any split fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def meshnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshnet.cli", *args], capture_output=True,
                          text=True, timeout=600, check=False)


def test_meshnet_parity_prints_the_json_report_of_every_split(
    parity_tool: Path, smollm2: Path,
) -> None:
    proc = meshnet("parity", "--model", str(smollm2), "--split", "0:15,15:30",
                   "--split", "0:10,10:20,20:30", "--threads", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert [s["split"] for s in report["splits"]] == ["0:15,15:30", "0:10,10:20,20:30"]
    for split in report["splits"]:
        assert split["greedy_identical"] is True
        assert split["max_abs_logit_diff"] <= 1e-4
        assert all(stage["weight_bytes"] > 0 for stage in split["stages"])


def test_meshnet_parity_summarises_for_people(parity_tool: Path, smollm2: Path) -> None:
    proc = meshnet("parity", "--model", str(smollm2), "--split", "0:20,20:30",
                   "--n-decode", "4", "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    assert "split 0:20,20:30: identical" in proc.stdout
    assert "stage   0:20" in proc.stdout and "stage  20:30" in proc.stdout


def test_meshnet_parity_exits_1_when_a_split_differs(parity_tool: Path, smollm2: Path) -> None:
    proc = meshnet("parity", "--model", str(smollm2), "--split", "0:15,15:30",
                   "--n-decode", "4", "--threads", "2", "--perturb", "0.01")
    assert proc.returncode == 1
    assert "split 0:15,15:30: DIFFERS" in proc.stdout
