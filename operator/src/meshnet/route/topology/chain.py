"""Chain: the driver calls the first stage only; every stage relays its boundary to the
next (--next-stage) and the last stage's token comes back along the chain, so the
driver-to-stage legs drop from 2S to 2 and boundaries never pass through the driver. A
prefill of several chunks that can be pipelined still goes as the hub's wavefront."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from meshnet.route.errors import StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.requests import ask_verified, relay_request
from meshnet.route.speculation import accepted_tokens
from meshnet.route.topology import Topology
from meshnet.route.topology.hub import in_chunks, step_by_step

if TYPE_CHECKING:
    from meshnet.route.session import Session


class ChainWalk:
    loops = False

    def __init__(self, topology: Topology = Topology.CHAIN) -> None:
        self.topology = topology  # a ring's prefill and verification go as a chain's

    def feed(self, session: Session, tokens: list[int], n_past: int) -> int:
        return in_chunks(session, tokens, n_past,
                         lambda part, at, last: chain_step(session, part, at, wants_token=last))

    def verify(self, session: Session, tokens: list[int], discard: bool) -> list[int]:
        n_past = len(session.history)
        request = relay_request(session.route, session.key(), tokens, n_past, session.answer)
        ask_verified(request, session.answer, tokens, discard)
        return accepted_tokens(session, relayed(session, request), tokens, n_past)

    def decode(self, session: Session, token: int, count: int, stop_ids: set[int],
               pending: list[int], drafts: int) -> Iterator[int]:
        return step_by_step(self.feed, session, count, stop_ids, pending)


def chain_step(session: Session, tokens: list[int], n_past: int,
               wants_token: bool = True) -> int:
    """One step through the chain: only the first stage is called. Without `wants_token`
    (a prefill chunk before the last) it asks for the cheapest answer."""
    request = relay_request(session.route, session.key(), tokens, n_past, session.answer,
                            wants_token)
    return session.take_output(relayed(session, request), request.positions[-1])


def relayed(session: Session, request: pb.ForwardRequest) -> pb.ForwardResponse:
    """The chain's answer to `request`, sent to the first stage; the boundaries it
    carried between the stages are counted."""
    route = session.route
    response = session.answered(session.clients[0].forward(request))
    session.result.boundary_bytes += route.seam_bytes_per_token * len(request.positions) * (
        len(route.stages) - 1)
    check_chain(route, response)
    return response


def check_chain(route: RouteInfo, response: pb.ForwardResponse) -> None:
    """The stages that ran the step are the route's (CHAIN_MISMATCH, recoverable: a stage
    of the chain restarted or was replaced)."""
    hops = [(h.layers.begin, h.layers.end, h.incarnation) for h in response.chain]
    expected = [(s.begin, s.end, s.incarnation) for s in route.stages]
    if hops != expected:
        raise StageError(
            route.stages[0].endpoint, "FAILED_PRECONDITION", "CHAIN_MISMATCH",
            f"the --next-stage chain ran {hops}, the route is {expected}",
        )
