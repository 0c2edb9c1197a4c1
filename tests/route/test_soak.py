"""A bounded soak of a 2-stage chain: concurrent users who finish, users who walk away
mid-answer, stages killed and restarted under them, and strangers opening garbage
connections to every port. Afterwards every slot on every stage is free and every
answer that completed is the prompt's solo greedy answer.

MESHNET_SOAK_SECONDS (default 30) sets the length; MESHNET_SOAK_SEED replays a run."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, RouteError, StageClient, StageError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at",
    "My favourite recipe for soup starts with",
]
MAX_TOKENS = 12
USERS = 4


class _WalkedAway(Exception):
    """A user who stops reading mid-answer."""


@pytest.fixture(scope="module")
def chain(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/soak", slots=8,
                        ctx=256,
                        threads=1)
             for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("soak"), chain=True)
    yield workers
    for worker in workers:
        worker.stop()


def walks_away_after(count: int | None) -> Callable[[int], None]:
    seen = [0]

    def on_token(_: int) -> None:
        seen[0] += 1
        if count is not None and seen[0] >= count:
            raise _WalkedAway

    return on_token


def relay_port(worker: WorkerProcess) -> int:
    """Its local relay port, once it answers (right after a restart the channel may still
    be backing off from the killed process)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return int(StageClient(worker.endpoint, timeout=5).info().local_relay_port)
        except StageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def garbage(rng: random.Random, port: int) -> None:
    """A stranger: connects, sends random bytes (or nothing), and leaves."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2) as sock:
        if rng.random() < 0.7:
            sock.sendall(rng.randbytes(rng.choice([1, 4, 64, 4096])))
        time.sleep(rng.random() * 0.2)


def test_a_soak_of_users_kills_and_strangers_leaves_every_slot_free_and_every_answer_exact(
    chain: list[WorkerProcess], reference: Callable[..., list[int]],
) -> None:
    seconds = float(os.environ.get("MESHNET_SOAK_SECONDS", "30"))
    seed = int(os.environ.get("MESHNET_SOAK_SEED", str(random.randrange(2**32))))
    print(f"soak seed {seed}, {seconds} s")
    endpoints = [w.endpoint for w in chain]
    expected = {}
    with RouteDriver(endpoints, route_key=route_key_of(chain)) as solo:
        for prompt in PROMPTS:
            answer = solo.generate(prompt, max_tokens=MAX_TOKENS, stop_at_eos=False)
            assert answer.tokens == reference(answer.prompt_tokens, MAX_TOKENS), prompt
            expected[prompt] = answer.tokens

    counts: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []
    unexpected: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def user(index: int) -> None:
        rng = random.Random(seed + index)
        with RouteDriver(endpoints, route_key=route_key_of(chain)) as driver:
            while not stop.is_set():
                prompt = rng.choice(PROMPTS)
                leave_after = rng.choice([None, None, None, 1, 3, 6])

                try:
                    answer = driver.generate(prompt, max_tokens=MAX_TOKENS, stop_at_eos=False,
                                             on_token=walks_away_after(leave_after))
                except _WalkedAway:
                    outcome = "walked away"
                except RouteError as exc:  # a kill can outlast the allowed recoveries
                    outcome = f"failed: {type(exc).__name__}"
                except BaseException as exc:  # reported below
                    with lock:
                        unexpected.append(exc)
                    return
                else:
                    outcome = "completed"
                    if answer.tokens != expected[prompt]:
                        with lock:
                            wrong.append(f"{prompt!r}: {answer.tokens} != {expected[prompt]}")
                    if answer.recoveries:
                        outcome = "completed after recovery"
                with lock:
                    counts[outcome] += 1

    users = [threading.Thread(target=user, args=(i,)) for i in range(USERS)]
    for thread in users:
        thread.start()
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    next_kill = time.monotonic() + rng.uniform(4, 8)
    try:
        while time.monotonic() < deadline:
            if time.monotonic() >= next_kill:
                victim = rng.choice(chain)
                victim.kill()
                time.sleep(rng.uniform(0, 1))
                victim.start()
                counts[f"killed stage {chain.index(victim)}"] += 1
                next_kill = time.monotonic() + rng.uniform(4, 8)
            worker = rng.choice(chain)
            garbage(rng, rng.choice([worker.port, worker.metrics_port, relay_port(worker)]))
            counts["garbage connections"] += 1
    finally:
        stop.set()
        for thread in users:
            thread.join(timeout=300)
    print(f"soak: {dict(counts)}")

    assert not unexpected, unexpected
    assert not wrong, wrong
    assert counts["completed"] + counts["completed after recovery"] >= USERS
    assert all(w.running() for w in chain)
    # Every ending released its session on every stage.
    deadline = time.monotonic() + 10
    while True:
        free = [StageClient(w.endpoint).capacity() for w in chain]
        if all(c.slots_free == c.slots_total for c in free) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [c.slots_free for c in free] == [c.slots_total for c in free]
    with RouteDriver(endpoints, route_key=route_key_of(chain)) as after:
        assert after.generate(PROMPTS[0], max_tokens=MAX_TOKENS,
                              stop_at_eos=False).tokens == expected[PROMPTS[0]]
