"""Loop: the first stage decodes by itself (ForwardStream continue_tokens), feeding each
token the chain's end samples straight back in as its next step, and answers each on the
stream: the driver is out of the per-token path. The ring is this walk over a chain whose
first stage takes each token straight from the last stage (--ring-last); for the driver
the stream is the same. A loop with drafts speculates in the first stage
(ForwardRequest.loop_drafts). Prefill and verification go as the walk underneath."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from meshnet.route.requests import Reuse, loop_request
from meshnet.route.step_context import DecodedStep, StepContext
from meshnet.route.topology.chain import check_chain
from meshnet.route.topology.walk import Walk


class LoopWalk:
    loops = True

    def __init__(self, under: Walk) -> None:
        self.under = under
        self.topology = under.topology

    def feed(self, ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse) -> int:
        return self.under.feed(ctx, tokens, n_past, reuse)

    def verify(self, ctx: StepContext, tokens: list[int], n_past: int,
               discard: bool) -> list[int]:
        return self.under.verify(ctx, tokens, n_past, discard)

    def decode(self, ctx: StepContext, token: int, history: Sequence[int], count: int,
               stop_ids: set[int], drafts: int, windows: int) -> Generator[DecodedStep]:
        """The first stage decodes `count` tokens by itself. `drafts`: it speculates,
        drafting up to that many tokens per step from the history, with up to `windows`
        verify windows in flight; a step then answers the drafts that held and one more
        token. Ends after `count` tokens or a stop id."""
        route = ctx.route
        request = loop_request(route, ctx.key, token, len(history), count, stop_ids,
                               ctx.answer, ctx.reuse, drafts, history, windows)
        stream = ctx.clients[0].forward_stream(request)
        produced = 0
        try:
            for response in stream:
                ctx.answered(response)
                check_chain(route, response)
                sampled = ([int(t) for t in response.sampled_tokens]
                           or [ctx.token_of(response, response.n_past - 1)])
                ctx.counts.loop_depth = max(ctx.counts.loop_depth, response.loop_depth)
                ctx.counts.boundary_bytes += route.seam_bytes_per_token * (
                    len(route.stages) - 1) * (1 + response.drafted_tokens)
                yield DecodedStep(sampled, response.drafted_tokens)
                produced += len(sampled)
                if produced >= count or stop_ids.intersection(sampled):
                    return
        finally:
            stream.cancel()
