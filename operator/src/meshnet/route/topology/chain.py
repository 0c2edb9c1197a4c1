"""Chain: the driver calls the first stage only; every stage relays its boundary to the
next (--next-stage) and the last stage's token comes back along the chain, so the
driver-to-stage legs drop from 2S to 2 and boundaries never pass through the driver. A
prefill of several chunks that can be pipelined still goes as the hub's wavefront."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from meshnet.api.common import Topology
from meshnet.route.errors import StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, relay_request, sampled_output, verified_output
from meshnet.route.step_context import DecodedStep, StepContext
from meshnet.route.topology.hub import in_chunks, step_by_step


class ChainWalk:
    loops = False

    def __init__(self, topology: Topology = "chain") -> None:
        self.topology = topology  # a ring's prefill and verification go as a chain's

    def feed(self, ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse) -> int:
        return in_chunks(ctx, tokens, n_past, reuse,
                         lambda part, at, last: chain_step(ctx, part, at, reuse, last))

    def verify(self, ctx: StepContext, tokens: list[int], n_past: int,
               discard: bool) -> list[int]:
        request = relay_request(ctx.route, ctx.key, tokens, n_past,
                                verified_output(ctx.answer, len(tokens)), ctx.reuse, discard)
        return ctx.accepted(relayed(ctx, request), tokens, n_past)

    def decode(self, ctx: StepContext, token: int, history: Sequence[int], count: int,
               stop_ids: set[int], drafts: int, windows: int) -> Generator[DecodedStep]:
        return step_by_step(self.feed, ctx, token, len(history), count, stop_ids)


def chain_step(ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse,
               wants_token: bool = True) -> int:
    """One step through the chain, asking the prefix cache for `reuse`: only the first
    stage is called. Without `wants_token` (a prefill chunk before the last) it asks for
    the cheapest answer."""
    request = relay_request(ctx.route, ctx.key, tokens, n_past,
                            sampled_output(ctx.answer, len(tokens), wants_token), reuse)
    return ctx.token_of(relayed(ctx, request), request.positions[-1])


def relayed(ctx: StepContext, request: pb.ForwardRequest) -> pb.ForwardResponse:
    """The chain's answer to `request`, sent to the first stage; the boundaries it
    carried between the stages are counted."""
    route = ctx.route
    response = ctx.answered(ctx.clients[0].forward(request))
    ctx.counts.boundary_bytes += route.seam_bytes_per_token * len(request.positions) * (
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
