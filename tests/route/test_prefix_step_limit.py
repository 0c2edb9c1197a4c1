"""A stage's prefix block wider than a step may be (its --batch): the driver never sends a
step the stage refuses for its size, and the operator's bound is the worker's own."""

from __future__ import annotations

import random
from pathlib import Path

from meshnet.api.shardroute import MAX_STEP_TOKENS, LayerRange
from meshnet.local.process import LaunchSpec, route_key_of, start_route
from meshnet.native.flags import worker_flags
from meshnet.route import RouteDriver


def test_a_block_wider_than_the_stages_step_limit_never_makes_a_step_too_large(
        shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    # Stages that step at most 256 tokens, with 512-token blocks (workers started by hand:
    # the operator refuses such a recipe): a whole block is no step they take.
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/step-limit",
                        threads=1, batch=256, prefix_cache_entries=2, prefix_block=512)
             for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path)
    try:
        with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers)) as route:
            route.connect(wait=30)
            assert route.route.max_step_tokens == 256
            rng = random.Random(7)
            prompt = [rng.randrange(200, 40000) for _ in range(700)]
            first = route.generate(prompt, max_tokens=4, stop_at_eos=False)
            again = route.generate(prompt, max_tokens=4, stop_at_eos=False)
            assert len(first.tokens) == 4 and again.tokens == first.tokens
            assert route.route.prefix_block == 0  # no block fits a step: no grid, no cache
            assert again.cached_tokens == 0
    finally:
        for worker in workers:
            worker.stop()


def test_the_recipes_step_limit_is_the_workers_default_batch(shard_worker: Path) -> None:
    # The operator leaves --batch to the worker (worker_command): the CRD's bound on
    # prefixCache.block must be that default.
    batch = next(f for f in worker_flags(shard_worker) if f.name == "--batch")
    assert batch.default == str(MAX_STEP_TOKENS)
