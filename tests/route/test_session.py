"""A session runs on its own snapshot of the route: its recovery frees it on every stage,
takes a fresh snapshot and walks the route found there, and changes no other session's
snapshot. No worker, no socket: the stage clients are stand-ins that record releases."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pytest

from meshnet.route.errors import RecoveryFailed, StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.sampling import Sampling
from meshnet.route.session import Session, SessionSettings
from meshnet.route.stage import StageClient

MakeRoute = Callable[..., RouteInfo]


class ReleaseRecorder:
    """A stage client that only records the sessions it is asked to free."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.released: list[pb.RouteKey] = []

    def release(self, key: pb.RouteKey, timeout: float) -> None:
        self.released.append(key)


class Refresh:
    """Hands out the next snapshot, as the driver's handshake would after a restart."""

    def __init__(self, *routes: RouteInfo) -> None:
        self.routes = list(routes)
        self.waits: list[float] = []
        self.refused: list[bool] = []  # whether each call was for a slot refused

    def __call__(self, wait: float, refused: bool = False) -> RouteInfo:
        self.waits.append(wait)
        self.refused.append(refused)
        return self.routes.pop(0)


def session(route: RouteInfo, refresh: Callable[[float, bool], RouteInfo],
            clients: list[ReleaseRecorder], **settings: Any) -> Session:
    stages = cast(list[StageClient], clients)
    return Session(stages, route, SessionSettings(**settings),
                   lambda wait, refused: (stages, refresh(wait, refused)), [1, 2, 3],
                   Sampling())


def cache_miss() -> StageError:
    return StageError("127.0.0.1:7002", "FAILED_PRECONDITION", "CACHE_MISS", "evicted")


def no_slot() -> StageError:
    return StageError("127.0.0.1:7002", "RESOURCE_EXHAUSTED", "CAPACITY_EXHAUSTED",
                      "every session slot is held by a recently used session")


def test_a_recovery_replaces_the_snapshot_of_that_session_alone(
    make_route_info: MakeRoute,
) -> None:
    before = make_route_info(2, chained=True, epoch=1)
    after = make_route_info(2, chained=True, epoch=2)
    clients = [ReleaseRecorder("127.0.0.1:7001"), ReleaseRecorder("127.0.0.1:7002")]
    refresh = Refresh(after)
    recovering = session(before, refresh, clients, wait_seconds=7.0)
    other = session(before, refresh, clients)
    old_id = recovering.session_id

    recovering.recover(cache_miss())

    assert recovering.route is after and recovering.key().epoch == 2
    assert recovering.session_id != old_id and recovering.result.session_id != old_id
    assert recovering.result.recovery_reasons == ["127.0.0.1:7002: CACHE_MISS"]
    assert refresh.waits == [7.0]
    assert other.route is before and other.key().epoch == 1
    # the lost session was freed on every stage under the epoch it ran in
    for client in clients:
        assert [(k.session_id, k.epoch) for k in client.released] == [(old_id, 1)]


def test_a_recovery_walks_the_route_the_fresh_snapshot_describes(
    make_route_info: MakeRoute,
) -> None:
    chained = make_route_info(3, chained=True)
    unchained = make_route_info(3)  # a stage came back without --next-stage
    clients = [ReleaseRecorder(f"127.0.0.1:700{i}") for i in range(3)]
    recovering = session(chained, Refresh(unchained), clients, decode_loop=False)
    assert recovering.walk.topology == "chain"

    recovering.recover(cache_miss())

    assert recovering.walk.topology == "hub" and not recovering.walk.loops


def test_recoveries_past_the_limit_give_up_with_every_reason(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(2)
    refresh = Refresh(route)
    clients = [ReleaseRecorder("a"), ReleaseRecorder("b")]
    recovering = session(route, refresh, clients, max_recoveries=1)
    recovering.recover(cache_miss())
    gave_up = r"gave up after 1 recoveries: .*CACHE_MISS; .*CACHE_MISS"
    with pytest.raises(RecoveryFailed, match=gave_up):
        recovering.recover(cache_miss())
    assert len(refresh.waits) == 1  # the give-up waits for no route


def test_a_recovered_session_refused_a_slot_waits_for_one_within_the_recovery_wait(
    make_route_info: MakeRoute,
) -> None:
    """Moved where every slot is held (a full replica), it asks again until `wait_seconds`
    after the loss, each refusal freed on every stage and counted as no recovery; then
    it fails saying why."""
    route = make_route_info(2)
    refresh = Refresh(route, route, route)
    clients = [ReleaseRecorder("a"), ReleaseRecorder("b")]
    moved = session(route, refresh, clients, wait_seconds=0.2)
    moved.recover(cache_miss())
    refused_id = moved.session_id
    moved.recover(no_slot())

    assert refresh.refused == [False, True] and 0 < refresh.waits[1] <= 0.2
    assert moved.result.recoveries == 1
    assert all(refused_id in [k.session_id for k in c.released] for c in clients)
    time.sleep(0.25)
    with pytest.raises(RecoveryFailed, match=r"no session slot came free within 0.2s .*"
                                             r"CACHE_MISS.*CAPACITY_EXHAUSTED"):
        moved.recover(no_slot())
    assert len(refresh.waits) == 2


def test_a_session_refused_a_slot_at_its_start_is_answered_so_at_once(
    make_route_info: MakeRoute,
) -> None:
    """Only a session a recovery moved waits: a new one the gateway placed is refused as
    the stage refused it."""
    route = make_route_info(2)
    refresh = Refresh(route)
    fresh = session(route, refresh, [ReleaseRecorder("a"), ReleaseRecorder("b")])
    refused = no_slot()
    with pytest.raises(StageError) as raised:
        fresh.recover(refused)
    assert raised.value is refused and refresh.waits == []


EXACT_ROWS = 8  # what the route's stages measured (route_info: a CPU worker's)
PROMPT = list(range(EXACT_ROWS))  # as wide as a joined step: nothing joins it
DECODED = list(range(EXACT_ROWS, 2 * EXACT_ROWS + 1))  # one token per step


@pytest.mark.parametrize(("architecture", "exact_rows", "refed"), [
    ("llama", EXACT_ROWS, [PROMPT, DECODED[:EXACT_ROWS], DECODED[EXACT_ROWS:]]),
    # a stage that measured exact steps of 3 rows only: joined up to 3
    ("llama", 3, [PROMPT, DECODED[:3], DECODED[3:6], DECODED[6:]]),
    ("llama", 0, [PROMPT, *([token] for token in DECODED)]),  # none claimed: as fed
    ("deepseek4", EXACT_ROWS, [PROMPT, *([token] for token in DECODED)]),  # step-sensitive
])
def test_a_recovered_history_is_refed_in_steps_that_compute_it_exactly(
    make_route_info: MakeRoute, architecture: str, exact_rows: int, refed: list[list[int]],
) -> None:
    route = make_route_info(2, architecture=architecture)
    route = replace(route, stages=(route.stages[0],
                                   replace(route.stages[1], exact_step_rows=exact_rows)))
    fed = session(route, Refresh(), [ReleaseRecorder("a"), ReleaseRecorder("b")])
    fed.remember(list(PROMPT))
    for token in DECODED:
        fed.remember([token])

    assert fed.forget_history() == refed
    assert fed.history == [] and fed.step_sizes == []


def test_an_error_that_is_not_recoverable_ends_the_session_as_it_came(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(2)
    refresh = Refresh(route)
    clients = [ReleaseRecorder("a"), ReleaseRecorder("b")]
    failing = session(route, refresh, clients)
    refused = StageError("a", "INVALID_ARGUMENT", "CONTEXT_OVERFLOW", "too long")
    with pytest.raises(StageError) as raised:
        failing.recover(refused)
    assert raised.value is refused
    assert refresh.waits == [] and failing.result.recoveries == 0
    assert all(client.released == [] for client in clients)
