"""Tiny random-weight deepseek4 GGUFs, written once per test session by our generator: an
8-layer model (F32, with Q8_0 experts, with an MTP block), one of V4's depth and layer
pattern, and DSpark drafters for both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshnet.devtools.tiny_deepseek4 import SMALL, V4_DEPTH, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK, write_tiny_dspark


@pytest.fixture(scope="session")
def ds4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deepseek4")


@pytest.fixture(scope="session")
def ds4_small(ds4_dir: Path) -> Path:
    """8 layers, ratios 0,0,4,128,4,128,4,0, layers 0-2 hash-routed, n_embd 64, F32."""
    return write_tiny_deepseek4(ds4_dir / "small.gguf", SMALL, seed=1)


@pytest.fixture(scope="session")
def ds4_small_q8(ds4_dir: Path) -> Path:
    """The same shape with Q8_0 routed and shared experts."""
    return write_tiny_deepseek4(ds4_dir / "small-q8.gguf",
                                dataclasses.replace(SMALL, expert_type="q8_0"), seed=2)


@pytest.fixture(scope="session")
def ds4_v4(ds4_dir: Path) -> Path:
    """43 layers: 0-1 and 42 sliding-window only, 2-41 CSA (even) and HCA (odd), the first
    three hash-routed."""
    return write_tiny_deepseek4(ds4_dir / "v4-43.gguf", V4_DEPTH, seed=3)


@pytest.fixture(scope="session")
def ds4_small_mtp(ds4_dir: Path) -> Path:
    """`ds4_small` (the same seed, so the same main weights) with one MTP block after layer 7."""
    return write_tiny_deepseek4(ds4_dir / "small-mtp.gguf",
                                dataclasses.replace(SMALL, mtp_layers=1), seed=1)


@pytest.fixture(scope="session")
def ds4_v4_mtp(ds4_dir: Path) -> Path:
    """`ds4_v4` (the same seed, so the same main weights) with one MTP block after layer 42."""
    return write_tiny_deepseek4(ds4_dir / "v4-43-mtp.gguf",
                                dataclasses.replace(V4_DEPTH, mtp_layers=1), seed=3)


@pytest.fixture(scope="session")
def ds4_dspark(ds4_dir: Path) -> Path:
    """A DSpark drafter for `ds4_small`: 3 stages reading layers 5-7, block size 5, Q8_0
    experts."""
    return write_tiny_dspark(ds4_dir / "small-dspark.gguf", SMALL, DSPARK, seed=4)


@pytest.fixture(scope="session")
def ds4_v4_dspark(ds4_dir: Path) -> Path:
    """A DSpark drafter for `ds4_v4`: 3 stages reading layers 40-42, as V4-Flash's does."""
    return write_tiny_dspark(ds4_dir / "v4-43-dspark.gguf", V4_DEPTH, DSPARK, seed=5)
