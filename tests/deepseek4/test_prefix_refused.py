"""deepseek4 and the prefix cache: its memory copies whole sequences only and its logits
depend on where a prompt's steps begin and end, so a stage started with the cache on
advertises no prefix block, answers a named prefix with a typed miss, and a repeated
prompt is served cold with the same tokens (docs/architecture.md, "Prefix cache")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, StageError
from meshnet.route.proto import pb

ROUTE_ID = "test/deepseek4-prefix"
PROMPT = "the map of the world and the map of the world and the map of the " * 8


@pytest.fixture(scope="module")
def two_stages(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=ds4_small, layers=LayerRange(*span), route_id=ROUTE_ID,
                        threads=1, ctx=512, prefix_cache_entries=2, prefix_block=16)
             for span in [(0, 4), (4, 8)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("ds4-prefix"))
    yield workers
    for worker in workers:
        worker.stop()


def test_a_deepseek4_route_refuses_the_prefix_cache_and_serves_cold(
    two_stages: list[WorkerProcess],
) -> None:
    with RouteDriver([w.endpoint for w in two_stages]) as driver:
        assert driver.route.prefix_block == 0
        first = driver.generate(PROMPT, max_tokens=6, stop_at_eos=False)
        again = driver.generate(PROMPT, max_tokens=6, stop_at_eos=False)
        assert first.cached_tokens == again.cached_tokens == 0
        assert again.tokens == first.tokens
        client = driver.clients[0]
        ids = driver.tokenize(PROMPT)
        key = pb.RouteKey(route_id=ROUTE_ID, epoch=1, session_id="named")
        step = pb.ForwardRequest(key=key, n_past=16, positions=range(16, len(ids)),
                                 tokens=ids[16:], prefix_tokens=ids[:16])
        with pytest.raises(StageError) as miss:
            client.forward(step)
        assert (miss.value.reason, miss.value.metadata["prefix_held"]) == ("CACHE_MISS", "0")
