"""What the prefix cache still refuses on deepseek4: its memory copies whole sequences only
and cannot drop a suffix, so an entry (a prompt kept up to its last grid boundary) is
reusable only whole. A prompt that shares only a part of an entry's tokens, or a prefix
that only a live session holds, is served cold, with the tokens a cold run gives
(docs/architecture.md, "Prefix cache")."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, StageError
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, stage_request

ROUTE_ID = "test/deepseek4-prefix"
PROMPT = "the map of the world and the map of the world and the map of the " * 4
BLOCK = 16


@pytest.fixture(scope="module")
def two_stages(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=ds4_small, layers=LayerRange(*span), route_id=ROUTE_ID,
                        threads=1, ctx=512, prefix_cache_entries=2, prefix_block=BLOCK)
             for span in [(0, 4), (4, 8)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("ds4-prefix"))
    yield workers
    for worker in workers:
        worker.stop()


def prefix_lookups(worker: WorkerProcess) -> int:
    """The stage's meshnet_shard_prefix_lookups_total."""
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    found = re.search(r"^meshnet_shard_prefix_lookups_total (\d+)$", text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


def named_prefix_miss(driver: RouteDriver, session: str, ids: list[int], reuse: int) -> str:
    """The first stage's `prefix_held` for a new session naming `ids[:reuse]`."""
    route = driver.route
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=session)
    step = stage_request(route, 0, key, ids[reuse:], reuse,
                         pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED),
                         Reuse(prefix=tuple(ids[:reuse])))
    with pytest.raises(StageError) as miss:
        driver.clients[0].forward(step)
    assert miss.value.reason == "CACHE_MISS"
    return miss.value.metadata["prefix_held"]


def test_a_part_of_a_whole_entry_is_not_reused_and_is_served_cold(
    two_stages: list[WorkerProcess],
) -> None:
    endpoints = [w.endpoint for w in two_stages]
    with RouteDriver(endpoints) as driver, RouteDriver(endpoints, reuse_prefix=False) as cold:
        assert driver.route.prefix_block == BLOCK
        ids = driver.tokenize(PROMPT)
        kept = (len(ids) - 1) // BLOCK * BLOCK
        assert kept > 2 * BLOCK
        first = driver.generate(ids, max_tokens=6, stop_at_eos=False)
        again = driver.generate(ids, max_tokens=6, stop_at_eos=False)
        assert (first.cached_tokens, again.cached_tokens) == (0, kept)  # whole: reused
        assert again.tokens == first.tokens
        # its first blocks only: the entry cannot drop the rest, so nothing is reused
        assert named_prefix_miss(driver, "part", ids, BLOCK) == "0"
        diverging = ids[:kept - BLOCK] + [7] * (2 * BLOCK)
        lookups = prefix_lookups(two_stages[0])
        run = driver.generate(diverging, max_tokens=6, stop_at_eos=False)
        assert run.cached_tokens == 0
        assert prefix_lookups(two_stages[0]) == lookups + 1  # held "0": straight to cold
        assert run.tokens == cold.generate(diverging, max_tokens=6, stop_at_eos=False).tokens


def test_a_live_session_is_not_a_source(two_stages: list[WorkerProcess]) -> None:
    with RouteDriver([w.endpoint for w in two_stages],
                     route_key=route_key_of(two_stages)) as driver:
        route = driver.route
        ids = [*driver.tokenize("the coast line of the sea " * 6), 5]
        live = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id="live")
        output = pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED)
        try:
            for n_past in range(0, 2 * BLOCK, BLOCK):  # two grid blocks, no snapshot asked
                previous = None
                for index, client in enumerate(driver.clients):
                    request = stage_request(route, index, live, ids[n_past:n_past + BLOCK],
                                            n_past, output, Reuse(), previous)
                    previous = client.forward(request)
            # it holds more than its prefix once it goes on: never copied from
            assert named_prefix_miss(driver, "from-live", ids, 2 * BLOCK) == "0"
        finally:
            for client in driver.clients:
                client.release(live)
