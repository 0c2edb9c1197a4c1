"""Hub: the driver calls every stage in turn and carries each boundary on. A prefill of
several chunks goes through as a wavefront, chunk k at stage s while chunk k-1 is at stage
s+1, so that every stage computes at once; stages that take turns on one host's CPUs get
one chunk after another instead."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from meshnet.route.proto import pb
from meshnet.route.requests import ask_verified, chunks, stage_request
from meshnet.route.speculation import accepted_tokens
from meshnet.route.topology import Topology

if TYPE_CHECKING:
    from meshnet.route.session import Session

    Feed = Callable[[Session, list[int], int], int]
    # One chunk of a feed: its tokens, their first position, whether it is the last.
    OneStep = Callable[[list[int], int, bool], int]


class HubWalk:
    topology = Topology.HUB
    loops = False

    def feed(self, session: Session, tokens: list[int], n_past: int) -> int:
        return in_chunks(session, tokens, n_past,
                         lambda part, at, _last: wavefront(session, part, at))

    def verify(self, session: Session, tokens: list[int], discard: bool) -> list[int]:
        route, key = session.route, session.key()
        n_past = len(session.history)
        last = len(route.stages) - 1
        boundary: pb.Boundary | None = None
        response = pb.ForwardResponse()
        for index, client in enumerate(session.clients):
            if boundary is not None:
                session.result.boundary_bytes += len(boundary.data)
            request = stage_request(route, index, key, tokens, n_past, boundary, session.answer)
            if index == last:
                ask_verified(request, session.answer, tokens, discard)
            elif discard:
                request.discard_from = n_past
            response = session.answered(client.forward(request))
            boundary = response.boundary
        return accepted_tokens(session, response, tokens, n_past)

    def decode(self, session: Session, token: int, count: int, stop_ids: set[int],
               pending: list[int], drafts: int) -> Iterator[int]:
        return step_by_step(self.feed, session, count, stop_ids, pending)


def in_chunks(session: Session, tokens: list[int], n_past: int, one_step: OneStep) -> int:
    """A feed cut into chunks (requests.chunks): as a wavefront when there is more than
    one and the stages do not take turns on the same CPUs, else chunk after chunk through
    `one_step`. The token sampled after the last."""
    route = session.route
    steps = chunks(route, len(tokens), session.settings.chunk_tokens)
    if len(steps) > 1 and not route.stages_take_turns:
        return wavefront(session, tokens, n_past, steps)
    token = -1
    for start, end in steps:
        token = one_step(tokens[start:end], n_past + start, end == len(tokens))
    return token


def wavefront(session: Session, tokens: list[int], n_past: int,
              steps: list[tuple[int, int]] | None = None) -> int:
    """`steps` of `tokens` (all of them in one by default) through every stage, step k at
    stage s while step k-1 is at stage s+1; the token sampled last."""
    steps = steps or [(0, len(tokens))]
    if len(steps) > 1:
        session.result.prefill_wavefront = True
    route, key = session.route, session.key()
    n_stages = len(session.clients)
    outputs: dict[tuple[int, int], pb.Boundary] = {}
    token = -1
    for wave in range(len(steps) + n_stages - 1):
        calls = []
        for stage_index in range(n_stages):
            step_index = wave - stage_index
            if not 0 <= step_index < len(steps):
                continue
            start, end = steps[step_index]
            boundary = outputs.pop((stage_index - 1, step_index), None)
            if boundary is not None:
                session.result.boundary_bytes += len(boundary.data)
            request = stage_request(route, stage_index, key, tokens[start:end], n_past + start,
                                    boundary, session.answer,
                                    wants_token=step_index == len(steps) - 1)
            call = session.clients[stage_index].forward_async(request)
            calls.append((stage_index, step_index, request, call))
        for stage_index, step_index, request, call in calls:
            response = session.answered(call.result())
            if stage_index < n_stages - 1:
                outputs[(stage_index, step_index)] = response.boundary
            elif step_index == len(steps) - 1:
                token = session.take_output(response, request.positions[-1])
    return token


def step_by_step(feed: Feed, session: Session, count: int, stop_ids: set[int],
                 pending: list[int]) -> Iterator[int]:
    """Decoding by the driver: each token fed back as the next step, one round trip each."""
    for _ in range(count):
        token = feed(session, [pending[0]], len(session.history))
        session.remember([pending[0]])
        pending[0] = token
        yield token
        if token in stop_ids:
            return
