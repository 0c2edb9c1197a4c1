"""The prefix cache's default block on deepseek4 changes none of its logits: a route without
the cache prefills in steps of the stages' step limit from position 0, and the default grid
is that one, whereas a finer grid computes other logits (its steps end elsewhere)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from meshnet.api.shardroute import MAX_STEP_TOKENS, PrefixCache
from meshnet.route import RouteDriver
from meshnet.route.proto import pb
from meshnet.route.requests import chunks, stage_request

from ..prefix_routes import start_cached_route

SPLIT = [(0, 2), (2, 3), (3, 8)]


def logits_after(driver: RouteDriver, prompt: list[int], session: str) -> bytes:
    """The last row's logits after `prompt`, cut into steps as the driver cuts a prefill."""
    route, clients = driver.route, driver.clients
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=session)
    response = pb.ForwardResponse()
    try:
        for start, end in chunks(route, len(prompt)):
            boundary = None
            for index, client in enumerate(clients):
                output = pb.OutputRequest(kind=pb.OUTPUT_KIND_LOGITS, rows=[end - start - 1])
                request = stage_request(route, index, key, prompt[start:end], start, output,
                                        boundary)
                response = client.forward(request)
                boundary = response.boundary
    finally:
        for client in clients:
            client.release(key)
    return np.asarray(response.rows[0].logits, dtype=np.float32).tobytes()


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
            with RouteDriver([w.endpoint for w in workers]) as driver:
                driver.connect(wait=30)
                assert driver.route.prefix_block == block and driver.route.step_sensitive
                logits[block] = logits_after(driver, prompt, "grid")
        finally:
            for worker in workers:
                worker.stop()
    assert logits[default] == logits[0]
    assert logits[100] != logits[0]  # the grid matters: another one is no default here
