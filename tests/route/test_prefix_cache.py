"""The prefix cache on a 3-stage SmolLM2 route of real workers: a session that starts from a
cached prefix computes the very bits a cold run computes (logits and tokens), reports the
cached tokens, and falls back to what every stage holds when one stage evicted its entry."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meshnet.local.process import WorkerProcess
from meshnet.route import RouteDriver, Sampling, StageError
from meshnet.route.prefix import first_try
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, stage_request

from ..prefix_routes import cold_runs, connected, last_logits, prefix_counts, start_cached_route

SPLIT = [(0, 10), (10, 20), (20, 30)]
BLOCK = 64


@pytest.fixture(scope="module")
def cached_route(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 in three stages with the prefix cache on; the last stage keeps one entry,
    the others two, so that it can lose an entry the others still hold."""
    workers = start_cached_route(shard_worker, smollm2, SPLIT, "test/prefix", BLOCK,
                                 lambda n: 1 if n == len(SPLIT) - 1 else 2,
                                 tmp_path_factory.mktemp("prefix"))
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


def scaffold(seed: int, n: int = 1100) -> list[int]:
    """`n` token ids of a long shared prompt (a system prompt, a tool scaffold)."""
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


def test_every_stage_advertises_the_same_prefix_block(driver: RouteDriver) -> None:
    assert driver.route.prefix_block == BLOCK


def test_a_hit_computes_the_cold_runs_logits_bit_for_bit(driver: RouteDriver) -> None:
    route, clients = driver.route, driver.clients
    prompt = scaffold(1)
    cold = last_logits(clients, route, "cold", prompt)
    reuse = first_try(len(prompt), BLOCK)
    assert reuse == 1088
    assert last_logits(clients, route, "hit", prompt, prefix=reuse) == cold
    # and a prefix that shares only its first blocks reuses those, exactly too
    other = prompt[:640] + scaffold(2, 300)
    other_cold = last_logits(clients, route, "other-cold", other)
    assert last_logits(clients, route, "other-hit", other, prefix=640) == other_cold


def test_a_stage_without_the_prefix_answers_a_typed_miss(driver: RouteDriver) -> None:
    route, clients = driver.route, driver.clients
    unseen = scaffold(3, 200)
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id="unseen")
    request = stage_request(route, 0, key, unseen[128:], 128,
                            pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED, rows=[71]),
                            Reuse(prefix=tuple(unseen[:128])))
    with pytest.raises(StageError) as miss:
        clients[0].forward(request)
    assert miss.value.reason == "CACHE_MISS"
    assert miss.value.metadata["prefix_held"] == "0"


def test_a_second_request_with_the_same_long_prefix_reuses_it_and_answers_the_same(
    driver: RouteDriver, cold: Callable[..., list[int]],
) -> None:
    prompt = scaffold(4) + scaffold(5, 40)
    sampled = Sampling(temperature=0.8, top_k=40, seed=11)
    first = driver.generate(prompt, max_tokens=12, stop_at_eos=False, sampling=sampled)
    hit = driver.generate(prompt, max_tokens=12, stop_at_eos=False, sampling=sampled)
    greedy_hit = driver.generate(prompt, max_tokens=12, stop_at_eos=False)
    assert first.cached_tokens == 0
    assert hit.cached_tokens == greedy_hit.cached_tokens == first_try(len(prompt), BLOCK)
    assert hit.cached_tokens >= 1000
    assert hit.to_json()["cached_tokens"] == hit.cached_tokens
    assert hit.tokens == first.tokens == cold(prompt, 12, sampled)
    assert greedy_hit.tokens == cold(prompt, 12)


def test_concurrent_sessions_with_the_same_prefix_each_reuse_it(
    driver: RouteDriver, cold: Callable[..., list[int]],
) -> None:
    shared = scaffold(6, 600)
    driver.generate([*shared, 300, 301], max_tokens=1)  # warms the stages
    prompts = [shared + scaffold(10 + i, 20) for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(
            lambda p: driver.generate(p, max_tokens=8, stop_at_eos=False), prompts))
    for prompt, run in zip(prompts, runs, strict=True):
        assert run.cached_tokens == 576
        assert run.tokens == cold(prompt, 8)


def test_an_entry_evicted_on_one_stage_falls_back_to_what_every_stage_holds(
    driver: RouteDriver, cold: Callable[..., list[int]],
) -> None:
    shared = scaffold(7, 400)
    first = driver.generate([*shared, 400], max_tokens=1)
    assert first.cached_tokens == 0
    # shares two blocks with it; the last stage keeps one entry, so this one replaces
    # the first's there, while the other stages keep both
    sibling = driver.generate(shared[:128] + scaffold(8, 200), max_tokens=1)
    assert sibling.cached_tokens == 128
    prompt = shared + scaffold(9, 30)
    run = driver.generate(prompt, max_tokens=8, stop_at_eos=False)
    assert run.cached_tokens == 128  # the last stage's miss named what it still holds
    assert run.recoveries == 0
    assert run.tokens == cold(prompt, 8)


def test_every_stage_counts_its_lookups_hits_and_reused_tokens(
    driver: RouteDriver, cached_route: list[WorkerProcess],
) -> None:
    prompt = scaffold(11, 200)
    driver.generate(prompt, max_tokens=1)
    before = [prefix_counts(worker) for worker in cached_route]
    hit = driver.generate(prompt, max_tokens=1)
    assert hit.cached_tokens == 192
    for worker, was in zip(cached_route, before, strict=True):
        now = prefix_counts(worker)
        assert now["prefix_hits_total"] - was["prefix_hits_total"] == 1
        assert now["prefix_lookups_total"] - was["prefix_lookups_total"] == 1
        assert now["prefix_reused_tokens_total"] - was["prefix_reused_tokens_total"] == 192
        assert now["prefix_cache_entries"] >= 1 and now["prefix_cache_bytes"] > 0


def test_a_restarted_stage_holds_no_entry_and_the_request_is_served_cold(
    driver: RouteDriver, cached_route: list[WorkerProcess], cold: Callable[..., list[int]],
) -> None:
    prompt = scaffold(12, 300)
    driver.generate(prompt, max_tokens=1)
    cached_route[-1].restart()  # a new incarnation: its entries are gone
    run = driver.generate(prompt, max_tokens=8, stop_at_eos=False)
    assert run.cached_tokens == 0
    assert run.tokens == cold(prompt, 8)
