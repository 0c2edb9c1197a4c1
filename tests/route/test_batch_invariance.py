"""A user's answer does not depend on what other users send: on a 2-stage SmolLM2 chain,
1, 8, 16 and 32 concurrent sessions (and a churning set: more sessions than slots, each
starting as another ends) each give exactly their prompt's solo greedy tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver
from meshnet.unsplit import unsplit_tokens

pytestmark = pytest.mark.slow

SLOTS = 32
TOKENS = 20
TOPICS = ["the sea", "mountains", "a small village", "the printing press", "rain",
          "an old map", "trains", "the moon"]


def prompt(n: int) -> str:
    return (f"<|im_start|>user\nWrite {n % 5 + 2} short sentences about "
            f"{TOPICS[n % len(TOPICS)]}.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def driver(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[RouteDriver]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/invariance",
                        threads=1,
                        slots=SLOTS, ctx=256) for span in [(0, 15), (15, 30)]]
    workers: list[WorkerProcess] = start_route(
        shard_worker, specs, tmp_path_factory.mktemp("invariance"), chain=True)
    with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers)) as route:
        route.connect(wait=30)
        yield route
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def solo(driver: RouteDriver, smollm2: Path) -> dict[int, list[int]]:
    """Each prompt's greedy tokens from the unsplit model, alone."""
    return {n: unsplit_tokens(smollm2, driver.tokenize(prompt(n)), TOKENS)
            for n in range(SLOTS)}


def generate(driver: RouteDriver, n: int) -> list[int]:
    return driver.generate(prompt(n), max_tokens=TOKENS, stop_at_eos=False).tokens


@pytest.mark.parametrize("sessions", [1, 8, 16, 32])
def test_concurrent_sessions_each_give_their_solo_tokens(
        driver: RouteDriver, solo: dict[int, list[int]], sessions: int) -> None:
    with ThreadPoolExecutor(sessions) as pool:
        together = list(pool.map(lambda n: generate(driver, n), range(sessions)))
    differing = [n for n in range(sessions) if together[n] != solo[n]]
    assert differing == [], f"{len(differing)}/{sessions} differ from their solo tokens"


def test_sessions_that_come_and_go_each_give_their_solo_tokens(
        driver: RouteDriver, solo: dict[int, list[int]]) -> None:
    """Six at a time out of 24, so every new session starts beside others at another point
    of their generation (and, in a shared KV pool, in whatever cells they left free)."""
    at_once = threading.Semaphore(6)

    def churn(n: int) -> list[int]:
        with at_once:
            return generate(driver, n % SLOTS)

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(churn, range(24)))
    differing = [n for n in range(24) if results[n] != solo[n % SLOTS]]
    assert differing == [], f"{len(differing)}/24 differ from their solo tokens"
