"""Prefix-cache poisoning, as an attacker who reaches a stage's port tries it: a stage after
the first computes a block's KV from the boundary it is sent, not from the token ids it
records, so the attacker sends that stage the victim's prompt ids with another text's
boundary (the first stage's boundary for a pirate's prompt), releases the session, and
waits for the victim's next request to start from the forged entry. The stage keeps the
digest chain of each block's boundary with the entry and serves a prefix only to a step
whose chain matches (docs/architecture.md, "Prefix cache"): the forged entry is never
served, on a route the driver walks stage by stage (hub) or one that relays (chain), and
an honest hit afterwards is bit for bit a cold run."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.local.process import WorkerProcess, route_key_of
from meshnet.route import RouteDriver, StageClient, StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.prefix import first_try
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, grid_chunks, stage_request

from ..prefix_routes import cold_runs, prefix_counts, start_cached_route

SPLIT = [(0, 15), (15, 30)]
BLOCK = 64


@pytest.fixture(scope="module")
def chained_route(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 in two chained stages with the prefix cache on (a driver may still call
    each stage itself: the hub)."""
    workers = start_cached_route(shard_worker, smollm2, SPLIT, "test/poison", BLOCK,
                                 lambda _: 4, tmp_path_factory.mktemp("poison"), chain=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def cold(chained_route: list[WorkerProcess]) -> Iterator[Callable[..., list[int]]]:
    with cold_runs(chained_route) as generate:
        yield generate


def prompt(seed: int, n: int = 300) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


def fed_on_the_grid(clients: list[StageClient], route: RouteInfo, session: str,
                    ids: list[int], boundaries: list[pb.Boundary] | None = None,
                    ) -> list[pb.Boundary]:
    """`ids` fed to one stage, on the cache's grid, as a new session, then released: the
    first stage (`boundaries` None; its boundary per step is returned), or else the last
    with `boundaries` as each step's input, whatever text they came from."""
    index = 0 if boundaries is None else len(clients) - 1
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=session)
    output = pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED)
    sent = []
    try:
        for step, (start, end) in enumerate(grid_chunks(BLOCK, len(ids), 0)):
            previous = (pb.ForwardResponse(boundary=boundaries[step])
                        if boundaries is not None else None)
            request = stage_request(route, index, key, ids[start:end], start, output, Reuse(),
                                    previous)
            sent.append(clients[index].forward(request).boundary)
    finally:
        clients[index].release(key)
    return sent


@pytest.mark.parametrize("topology", ["hub", "chain"])
def test_a_forged_entry_on_a_later_stage_is_never_served(
    topology: str, chained_route: list[WorkerProcess], cold: Callable[..., list[int]],
) -> None:
    seed = 100 if topology == "hub" else 200
    victim, pirate = prompt(seed), prompt(seed + 1)
    reuse = first_try(len(victim), BLOCK)
    assert reuse == 256
    last = chained_route[-1]
    with RouteDriver([w.endpoint for w in chained_route], topology=topology,
                     route_key=route_key_of(chained_route)) as driver:
        route, clients = driver.connect(wait=30), driver.clients
        # the first stage holds the victim's prefix, honestly (a shared system prompt)
        fed_on_the_grid(clients, route, f"{topology}-prime", victim[:reuse])
        # the attack: the victim's ids at the last stage, computed from the pirate's text
        pirate_boundaries = fed_on_the_grid(clients, route, f"{topology}-pirate", pirate)
        fed_on_the_grid(clients, route, f"{topology}-forged", victim, pirate_boundaries)

        # the next user sharing that prefix gets the cold answer, not the pirate's state
        before = prefix_counts(last)
        run = driver.generate(victim, max_tokens=8, stop_at_eos=False)
        after = prefix_counts(last)
        expected = cold(victim, 8)
        assert run.tokens == expected
        assert run.cached_tokens == 0
        assert after["prefix_lookups_total"] - before["prefix_lookups_total"] == 1
        assert after["prefix_hits_total"] == before["prefix_hits_total"]  # a miss there

        # the victim's own entry is reused, bit for bit, beside the forged one
        honest = driver.generate(victim, max_tokens=8, stop_at_eos=False)
        assert honest.cached_tokens == reuse
        assert honest.tokens == expected


def test_a_later_stage_reuses_only_the_blocks_computed_from_the_boundary_it_is_sent(
    chained_route: list[WorkerProcess], cold: Callable[..., list[int]],
) -> None:
    ids = prompt(300)
    with RouteDriver([w.endpoint for w in chained_route], topology="hub",
                     route_key=route_key_of(chained_route)) as driver:
        route, clients = driver.connect(wait=30), driver.clients
        honest = fed_on_the_grid(clients, route, "honest", ids)
        other = fed_on_the_grid(clients, route, "other", prompt(301))
        # at the last stage: its first two blocks from the victim's boundary, then another's
        fed_on_the_grid(clients, route, "half-forged", ids, honest[:2] + other[2:])
        key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id="probe")
        n_past = first_try(len(ids), BLOCK)
        try:
            reuse = Reuse(prefix=tuple(ids[:n_past]))
            first = stage_request(route, 0, key, ids[n_past:], n_past, pb.OutputRequest(), reuse)
            answer = clients[0].forward(first)  # the first stage's own entry: a hit
            assert len(answer.prefix_chain) == n_past // BLOCK
            # the last stage's request carries the prefix chain the first stage answered
            second = stage_request(route, 1, key, ids[n_past:], n_past,
                                   pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED), reuse, answer)
            with pytest.raises(StageError) as miss:
                clients[1].forward(second)
            assert miss.value.reason == "CACHE_MISS"
            assert miss.value.metadata["prefix_held"] == str(2 * BLOCK)  # the matching blocks
        finally:
            for client in clients:
                client.release(key)
        run = driver.generate(ids, max_tokens=8, stop_at_eos=False)
        assert run.cached_tokens == 2 * BLOCK
        assert run.tokens == cold(ids, 8)
