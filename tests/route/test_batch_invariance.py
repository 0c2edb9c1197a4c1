"""A user's answer does not depend on what other users send: on a 2-stage SmolLM2 chain,
1, 8, 16 and 32 concurrent sessions (and a churning set: more sessions than slots, each
starting as another ends) each give exactly their prompt's solo greedy tokens. On the
GPU lane (every layer on its device: Mesa's software Vulkan device in `make test`), 1, 8
and 16 sessions against each prompt's tokens alone on the same route, fewer tokens each:
that device is slow."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver
from meshnet.unsplit import unsplit_tokens

from ..lanes import Lane, on_gpu

pytestmark = pytest.mark.slow

SLOTS = 32
TOKENS = {"cpu": 20, "gpu": 4}  # by test lane (tests/lanes.py)
TOPICS = ["the sea", "mountains", "a small village", "the printing press", "rain",
          "an old map", "trains", "the moon"]


def prompt(n: int) -> str:
    return (f"<|im_start|>user\nWrite {n % 5 + 2} short sentences about "
            f"{TOPICS[n % len(TOPICS)]}.<|im_end|>\n<|im_start|>assistant\n")


@dataclass
class Route:
    lane: str  # the test lane's name: cpu or gpu
    driver: RouteDriver

    def generate(self, n: int) -> list[int]:
        return self.driver.generate(prompt(n), max_tokens=TOKENS[self.lane],
                                    stop_at_eos=False).tokens


@pytest.fixture(scope="module")
def route(request: pytest.FixtureRequest, lanes: Callable[[str], Lane], smollm2: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Route]:
    """The 2-stage chain on the lane the test names (indirect parametrization)."""
    lane = lanes(request.param)
    specs = [lane.spec(LaunchSpec(model=smollm2, layers=LayerRange(*span),
                                  route_id="test/invariance", threads=1, slots=SLOTS, ctx=256))
             for span in [(0, 15), (15, 30)]]
    workers: list[WorkerProcess] = start_route(
        lane.binary, specs, tmp_path_factory.mktemp(f"invariance-{lane.name}"), chain=True,
        timeout=600)
    with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers)) as driver:
        driver.connect(wait=30)
        yield Route(request.param, driver)
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def solo(route: Route, smollm2: Path) -> dict[int, list[int]]:
    """Each prompt's greedy tokens alone: from the unsplit model on the CPU lane (whose
    bits a split keeps), from the route itself, one session at a time, on a GPU lane."""
    if route.lane == "cpu":
        return {n: unsplit_tokens(smollm2, route.driver.tokenize(prompt(n)), TOKENS["cpu"])
                for n in range(SLOTS)}
    return {n: route.generate(n) for n in range(max(GPU_SESSIONS))}


# concurrent sessions: fewer on the GPU lane, Mesa's slow software device in `make test`
GPU_SESSIONS = (1, 8, 16)


@pytest.mark.parametrize("route", ["cpu"], indirect=True)
def test_sessions_that_come_and_go_each_give_their_solo_tokens(
        route: Route, solo: dict[int, list[int]]) -> None:
    """Six at a time out of 24, so every new session starts beside others at another point
    of their generation (and, in a shared KV pool, in whatever cells they left free)."""
    at_once = threading.Semaphore(6)

    def churn(n: int) -> list[int]:
        with at_once:
            return route.generate(n % SLOTS)

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(churn, range(24)))
    differing = [n for n in range(24) if results[n] != solo[n % SLOTS]]
    assert differing == [], f"{len(differing)}/24 differ from their solo tokens"


# One route per lane for all its session counts (a parameter per lane, not per pair, so the
# module's route and solo tokens are built once).
@pytest.mark.parametrize("sessions", [1, 8, 16, 32])
@pytest.mark.parametrize("route", ["cpu"], indirect=True)
def test_concurrent_sessions_each_give_their_solo_tokens(
        route: Route, solo: dict[int, list[int]], sessions: int) -> None:
    at_once(route, solo, sessions)


@pytest.mark.parametrize("sessions", GPU_SESSIONS)
@pytest.mark.parametrize("route", [on_gpu("gpu")], indirect=True)
def test_concurrent_sessions_on_the_gpu_lanes_device_each_give_their_solo_tokens(
        route: Route, solo: dict[int, list[int]], sessions: int) -> None:
    at_once(route, solo, sessions)


def at_once(route: Route, solo: dict[int, list[int]], sessions: int) -> None:
    with ThreadPoolExecutor(sessions) as pool:
        together = list(pool.map(route.generate, range(sessions)))
    differing = [n for n in range(sessions) if together[n] != solo[n]]
    assert differing == [], f"{len(differing)}/{sessions} differ from their solo tokens"
