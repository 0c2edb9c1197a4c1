"""Fixtures for the pin tests: a scratch checkout with its own manifest and workspace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Checkout:
    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / ".work"

    def manifest(self) -> dict:
        return yaml.safe_load((self.root / "llama-pin.yaml").read_text())

    def write_manifest(self, data: dict) -> None:
        (self.root / "llama-pin.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def meshnet(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "MESHNET_REPO": str(self.root)}
        env.pop("MESHNET_WORKSPACE", None)
        return subprocess.run(
            [sys.executable, "-m", "meshnet.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )


@pytest.fixture
def sdist_only_checkout(tmp_path: Path) -> Checkout:
    """A checkout whose pin lists only the sdist source (no network detour via git)."""
    shutil.copy(REPO / "llama-pin.yaml", tmp_path / "llama-pin.yaml")
    (tmp_path / "patches").mkdir()
    checkout = Checkout(tmp_path)
    data = checkout.manifest()
    data["sources"] = [s for s in data["sources"] if s["kind"] == "pypi-sdist"]
    data["patches"] = []
    checkout.write_manifest(data)
    return checkout


@pytest.fixture
def fetched_checkout(sdist_only_checkout: Checkout) -> Checkout:
    result = sdist_only_checkout.meshnet("pin", "fetch")
    assert result.returncode == 0, result.stderr
    return sdist_only_checkout
