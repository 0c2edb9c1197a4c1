"""The prefix cache on a 3-stage route of the small tiny deepseek4 model: its memory copies
whole sequences only, so each stage keeps a prompt up to its last grid boundary as an entry
of its own (a snapshot) and a later prompt that extends it (the next turn of a
conversation) starts from all of it, computing the very bits a cold run computes (logits
and tokens); a stage that lost the entry makes the session fall back to a shorter entry
every stage holds, or cold (docs/architecture.md, "Prefix cache")."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, Sampling
from meshnet.route.prefix import first_try

from ..prefix_routes import cold_runs, connected, last_logits, prefix_counts, start_cached_route

SPLIT = [(0, 2), (2, 3), (3, 8)]
BLOCK = 32


@pytest.fixture(scope="module")
def cached_route(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    """The small model in three stages with the prefix cache on; the last stage keeps one
    entry, the others three, so that it can lose an entry the others still hold (and they
    keep it while a try that the last stage refuses leaves its snapshot on them)."""
    workers = start_cached_route(shard_worker, ds4_small, SPLIT, "test/ds4-prefix", BLOCK,
                                 lambda n: 1 if n == len(SPLIT) - 1 else 3,
                                 tmp_path_factory.mktemp("ds4-prefix"), ctx=512)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def driver(cached_route: list[WorkerProcess]) -> Iterator[RouteDriver]:
    with connected(cached_route) as route:
        yield route


@pytest.fixture(scope="module")
def cold(cached_route: list[WorkerProcess]) -> Iterator[Callable[..., list[int]]]:
    with cold_runs(cached_route) as generate:
        yield generate


def words(seed: int, n: int) -> list[int]:
    """`n` token ids of the tiny vocabulary (its specials aside)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 170) for _ in range(n)]


def reaches(read: Callable[[], float], value: float, seconds: float = 2.0) -> float:
    """`read()` once it gives `value` (a gauge the stage sets right after it answers a
    release), or its last reading after `seconds`."""
    deadline = time.monotonic() + seconds
    while (now := read()) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_every_deepseek4_stage_advertises_the_prefix_block(driver: RouteDriver) -> None:
    assert driver.route.step_sensitive
    assert driver.route.prefix_block == BLOCK


def test_a_next_turn_from_a_whole_entry_computes_the_cold_runs_logits_bit_for_bit(
    driver: RouteDriver, cached_route: list[WorkerProcess],
) -> None:
    route, clients = driver.route, driver.clients
    turn = words(1, 150)  # past 128 positions: the HCA layers' compressed state is copied too
    kept = first_try(len(turn), BLOCK)
    assert kept == 128
    last_logits(clients, route, "first", turn, snapshot=kept)
    for worker in cached_route:  # the entry's cells count as used, as a live session's do
        assert reaches(lambda w=worker: prefix_counts(w)["kv_tokens_used"], kept) == kept
        assert prefix_counts(worker)["prefix_cache_entries"] == 1
    following = turn + words(2, 70)
    cold = last_logits(clients, route, "cold", following)
    assert last_logits(clients, route, "hit", following, prefix=kept) == cold


def test_the_next_turn_of_a_conversation_reuses_the_last_and_answers_the_same(
    driver: RouteDriver, cold: Callable[..., list[int]],
) -> None:
    turn = words(3, 150)
    first = driver.generate(turn, max_tokens=8, stop_at_eos=False)
    assert first.cached_tokens == 0
    following = turn + first.tokens + words(4, 40)
    sampled = Sampling(temperature=0.8, top_k=40, seed=11)
    # tries its own last boundary (192) first: every stage holds the first turn's 128 only
    hit = driver.generate(following, max_tokens=8, stop_at_eos=False, sampling=sampled)
    assert hit.cached_tokens == first_try(len(turn), BLOCK) == 128
    assert hit.recoveries == 0
    # that session kept the second turn's prompt as an entry too
    again = driver.generate(following, max_tokens=8, stop_at_eos=False)
    assert again.cached_tokens == first_try(len(following), BLOCK) == 192
    assert hit.tokens == cold(following, 8, sampled)
    assert again.tokens == cold(following, 8)


def test_an_entry_lost_on_one_stage_falls_back_to_a_shorter_one_every_stage_holds(
    driver: RouteDriver, cold: Callable[..., list[int]],
) -> None:
    turn = words(5, 150)
    assert driver.generate(turn, max_tokens=1).cached_tokens == 0  # entries of 128
    # a first part of it leaves entries of 64; the last stage keeps one entry: this one
    assert driver.generate(turn[:90], max_tokens=1).cached_tokens == 0
    following = turn + words(6, 50)
    run = driver.generate(following, max_tokens=8, stop_at_eos=False)
    assert run.cached_tokens == 64  # 192 missed, 128 missed on the last stage, 64 hit
    assert run.recoveries == 0
    assert run.tokens == cold(following, 8)


def test_a_restarted_stage_holds_no_entry_and_the_next_turn_is_served_cold(
    driver: RouteDriver, cached_route: list[WorkerProcess], cold: Callable[..., list[int]],
) -> None:
    turn = words(7, 100)
    driver.generate(turn, max_tokens=1)
    cached_route[1].restart()  # a new incarnation: its entries are gone
    following = turn + words(8, 30)
    run = driver.generate(following, max_tokens=8, stop_at_eos=False)
    assert run.cached_tokens == 0
    assert run.tokens == cold(following, 8)


@pytest.fixture(scope="module")
def ring_route(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    """The same split as a ring: the stages relay each step (and what it asks) on."""
    specs = [LaunchSpec(model=ds4_small, layers=LayerRange(*span), route_id="test/ds4-ring",
                        threads=1, ctx=512, prefix_cache_entries=2, prefix_block=BLOCK)
             for span in SPLIT]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("ds4-ring"), chain=True,
                          ring=True)
    yield workers
    for worker in workers:
        worker.stop()


def test_a_ring_relays_the_snapshot_and_the_prefix_to_every_stage(
    ring_route: list[WorkerProcess],
) -> None:
    endpoints, key = [w.endpoint for w in ring_route], route_key_of(ring_route)
    with (RouteDriver(endpoints, route_key=key, topology="ring") as driver,
          RouteDriver(endpoints, route_key=key, topology="ring", reuse_prefix=False) as cold):
        turn = words(9, 100)
        first = driver.generate(turn, max_tokens=4, stop_at_eos=False)
        following = turn + first.tokens + words(10, 30)
        hit = driver.generate(following, max_tokens=8, stop_at_eos=False)
        assert (first.cached_tokens, hit.cached_tokens) == (0, 96)
        assert hit.tokens == cold.generate(following, max_tokens=8, stop_at_eos=False).tokens
        assert all(prefix_counts(worker)["prefix_hits_total"] == 1 for worker in ring_route)
