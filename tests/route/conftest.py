"""Routes of real meshnet-shard-worker processes on 127.0.0.1 serving SmolLM2-135M, and
the unsplit reference (plain llama.cpp) they must agree with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.layers import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route

SPLIT = [(0, 10), (10, 20), (20, 30)]


def route_specs(model: Path, epoch: int = 1) -> list[LaunchSpec]:
    return [LaunchSpec(model=model, layers=LayerRange(*span), route_id="test/route", epoch=epoch,
                       threads=1)
            for span in SPLIT]


@pytest.fixture(scope="session")
def make_route_specs() -> Callable[[Path], list[LaunchSpec]]:
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

