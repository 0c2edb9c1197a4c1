"""The prefix cache's default block on deepseek4 changes none of its logits: a route without
the cache prefills in steps of the stages' step limit from position 0, and the default grid
is that one, whereas a finer grid computes other logits (its steps end elsewhere)."""

from __future__ import annotations

import random
from pathlib import Path

from meshnet.api.shardroute import MAX_STEP_TOKENS, PrefixCache
from meshnet.local.process import route_key_of
from meshnet.route import RouteDriver

from ..prefix_routes import last_logits, start_cached_route

SPLIT = [(0, 2), (2, 3), (3, 8)]


def test_the_default_block_gives_deepseek4_a_cache_off_routes_logits(
        shard_worker: Path, ds4_small: Path, tmp_path: Path) -> None:
    default = PrefixCache().stage_block("deepseek4")
    assert default == MAX_STEP_TOKENS
    rng = random.Random(5)
    prompt = [rng.randrange(3, 170) for _ in range(MAX_STEP_TOKENS + 200)]  # past a block
    logits = {}
    for block in (0, default, 100):  # 0: the cache off
        (tmp_path / str(block)).mkdir()
        entries = 4 if block else 0
        workers = start_cached_route(shard_worker, ds4_small, SPLIT, f"test/ds4-grid-{block}",
                                     block or default, lambda n, e=entries: e,
                                     tmp_path / str(block), ctx=1024)
        try:
            with RouteDriver([w.endpoint for w in workers],
                             route_key=route_key_of(workers)) as driver:
                driver.connect(wait=30)
                assert driver.route.prefix_block == block and driver.route.step_sensitive
                logits[block] = last_logits(driver.clients, driver.route, "grid", prompt)
        finally:
            for worker in workers:
                worker.stop()
    assert logits[default] == logits[0]
    assert logits[100] != logits[0]  # the grid matters: another one is no default here
