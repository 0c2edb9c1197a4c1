"""What the prefix-cache suites share (tests/route for SmolLM2, tests/deepseek4 for V4's
whole entries): a route of real workers with the cache on, the cold run it is compared
with, the logits after a prompt fed on the prefix grid, and the stages' cache metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, Sampling, StageClient
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, chunks, stage_request


def start_cached_route(shard_worker: Path, model: Path, split: Sequence[tuple[int, int]],
                       route_id: str, block: int, entries: Callable[[int], int],
                       workdir: Path, ctx: int | None = None, chain: bool = False,
                       ring: bool = False) -> list[WorkerProcess]:
    """`model` split as `split`, one thread a stage, the cache's grid `block`; stage n keeps
    `entries(n)` entries (so that one stage can lose an entry the others still hold).
    `chain`: each stage relays to the next (--next-stage), as well as answering the driver;
    `ring`: a chain whose first stage takes each token from the last (--ring-last)."""
    extra = {"ctx": ctx} if ctx else {}
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), route_id=route_id, threads=1,
                        prefix_cache_entries=entries(n), prefix_block=block, **extra)
             for n, span in enumerate(split)]
    return start_route(shard_worker, specs, workdir, chain=chain, ring=ring)


@contextmanager
def connected(workers: Sequence[WorkerProcess], reuse_prefix: bool = True,
              ) -> Iterator[RouteDriver]:
    with RouteDriver([w.endpoint for w in workers],
                     route_key=route_key_of(workers), reuse_prefix=reuse_prefix) as route:
        route.connect(wait=30)
        yield route


@contextmanager
def cold_runs(workers: Sequence[WorkerProcess]) -> Iterator[Callable[..., list[int]]]:
    """The tokens a cold run on this route generates: the same grid, no prefix reused."""
    with connected(workers, reuse_prefix=False) as route:
        def generate(prompt: list[int], n: int, sampling: Sampling | None = None) -> list[int]:
            run = route.generate(prompt, max_tokens=n, stop_at_eos=False, sampling=sampling)
            assert run.cached_tokens == 0
            return run.tokens

        yield generate


def last_logits(clients: Sequence[StageClient], route: RouteInfo, session: str,
                prompt: list[int], prefix: int = 0, snapshot: int = 0) -> bytes:
    """The logits after `prompt` on a new session, fed stage by stage in the steps the
    driver cuts a prefill into (a cache's grid, else the cache-off steps) from position
    `prefix` (> 0: its first step names the cached prefix, and on a stage after the first
    the previous stage's chain for it); the step at
    `snapshot` (> 0) asks every stage to keep the positions before it as an entry (a
    whole-entries memory's way). The session is released after."""
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=session)
    reuse = Reuse().prefilling(prompt[:prefix], snapshot)
    response = pb.ForwardResponse()
    try:
        for start, end in chunks(route, len(prompt) - prefix, n_past=prefix):
            part, n_past = prompt[prefix + start:prefix + end], prefix + start
            previous: pb.ForwardResponse | None = None
            for index, client in enumerate(clients):
                output = pb.OutputRequest(kind=pb.OUTPUT_KIND_LOGITS, rows=[len(part) - 1])
                request = stage_request(route, index, key, part, n_past, output, reuse,
                                        previous)
                response = previous = client.forward(request)
    finally:
        for client in clients:
            client.release(key)
    return np.asarray(response.rows[0].logits, dtype=np.float32).tobytes()


def prefix_counts(worker: WorkerProcess) -> dict[str, float]:
    """The stage's meshnet_shard_prefix_* metrics and its KV cells in use, by their names
    less `meshnet_shard_`."""
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    return {name.removeprefix("meshnet_shard_"): float(value)
            for name, value in (line.split() for line in text.splitlines()
                                if line.startswith(("meshnet_shard_prefix_",
                                                    "meshnet_shard_kv_tokens_used")))}
