"""A three-stage route of real meshnet-shard-worker processes (SmolLM2-135M, one thread
each) to certify against the unsplit reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.certification import Certificate, CertifiedLane, ParityResult
from meshnet.api.shardroute import LayerRange
from meshnet.certify import verdict
from meshnet.certify.gates import Gates
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route

Route = Callable[[str], list[WorkerProcess]]
# Tests that a correct route passes measure its speed but do not gate it: on a shared
# machine a split route's decode speed over the unsplit one's is a figure of the load
# (0.18 to 1.44 of it, round by round, on this 2-core machine with and without two busy
# loops beside), not of the code. bench/route_bench.py gives the figure;
# test_an_impossible_speed_fraction_fails_the_lane_naming_the_figures, the gate's verdict.
SPEED_MEASURED_NOT_GATED = Gates(speed_fraction=0.0)
LANE = CertifiedLane(backend="cpu", gpu_product="none", manifest_digest="a" * 64,
                     recipe_digest="b" * 64)


def cert(passed: bool = True, request: str | None = None, **lane: str) -> Certificate:
    return verdict.certificate(
        LANE.model_copy(update=lane),
        ParityResult(prompts=4, decode_steps=8, max_abs_delta_logit=0.0, rows_compared=36,
                     rows_differing=0, tolerance=0.0, exact=True, greedy_match=True),
        verdict.speed(40.0, 44.0, 0.5 if passed else 100.0, "hub"),
        stages=3, now="2026-11-29T12:00:00Z", request=request)


@pytest.fixture(scope="module")
def start(shard_worker: Path, smollm2: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Route]:
    """start(boundary_dtype): SmolLM2 split 0:10, 10:20, 20:30 (stopped after the module)."""
    running: list[WorkerProcess] = []

    def route(dtype: str) -> list[WorkerProcess]:
        specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/certify",
                            threads=1,
                            slots=2, ctx=512, boundary_dtype=dtype, metrics_listen="")
                 for span in ((0, 10), (10, 20), (20, 30))]
        workers = start_route(shard_worker, specs, tmp_path_factory.mktemp(f"route-{dtype}"))
        running.extend(workers)
        return workers

    yield route
    for worker in running:
        worker.stop()
