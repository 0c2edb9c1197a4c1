"""Every walk asks the stages' prefix cache for its session's reuse, so that none goes
silently cold: on one ringed route of real workers with the cache on, walked as a hub, a
chain or a ring, a second request with the same long prefix reports the cached tokens and
answers, token for token, what a cold run answers. Each walk's requests carry the
tenant's salt too: its first request reuses no other salt's entry of the same prompt."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshnet.local.process import WorkerProcess, route_key_of
from meshnet.route import RouteDriver
from meshnet.route.prefix import first_try

from ..prefix_routes import cold_runs, start_cached_route

SPLIT = [(0, 15), (15, 30)]
BLOCK = 64
PROMPT = [random.Random(48).randrange(200, 40000) for _ in range(300)]
TOKENS = 8
# How a driver walks the ringed route as each topology: a chain is the ring's chain
# without the first stage's decode loop.
WALKS: dict[str, dict[str, Any]] = {
    "hub": {"topology": "hub"},
    "chain": {"topology": "chain", "decode_loop": False},
    "ring": {"topology": "ring"},
}


@pytest.fixture(scope="module")
def ringed_route(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 in two stages started as a ring (a chain too) with the prefix cache on."""
    workers = start_cached_route(shard_worker, smollm2, SPLIT, "test/prefix-walks", BLOCK,
                                 lambda _: 4, tmp_path_factory.mktemp("prefix-walks"),
                                 ring=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def cold_tokens(ringed_route: list[WorkerProcess]) -> list[int]:
    """What a cold run answers (it leaves an entry of the prompt for the empty salt)."""
    with cold_runs(ringed_route) as generate:
        return generate(PROMPT, TOKENS)


@pytest.mark.parametrize("walk", WALKS)
def test_a_second_request_with_the_same_long_prefix_reuses_it_on_every_walk(
    walk: str, ringed_route: list[WorkerProcess], cold_tokens: list[int],
) -> None:
    salt = walk.encode()  # each walk's own entries: its first request is cold
    with RouteDriver([w.endpoint for w in ringed_route], route_key=route_key_of(ringed_route),
                     **WALKS[walk]) as driver:
        driver.connect(wait=30)
        first = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False, cache_salt=salt)
        again = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False, cache_salt=salt)
    assert (first.topology, again.topology) == (walk, walk)
    assert (first.cached_tokens, again.cached_tokens) == (0, first_try(len(PROMPT), BLOCK))
    assert again.tokens == first.tokens == cold_tokens
