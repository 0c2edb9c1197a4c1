"""Loop: the first stage decodes by itself (ForwardStream continue_tokens), feeding each
token the chain's end samples straight back in as its next step, and answers each on the
stream: the driver is out of the per-token path. The ring is this walk over a chain whose
first stage takes each token straight from the last stage (--ring-last); for the driver
the stream is the same. A loop with drafts speculates in the first stage
(ForwardRequest.loop_drafts). Prefill and verification go as the walk underneath."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from meshnet.route.requests import loop_request
from meshnet.route.topology.chain import check_chain

if TYPE_CHECKING:
    from meshnet.route.session import Session
    from meshnet.route.topology.walk import Walk


class LoopWalk:
    loops = True

    def __init__(self, under: Walk) -> None:
        self.under = under
        self.topology = under.topology

    def feed(self, session: Session, tokens: list[int], n_past: int) -> int:
        return self.under.feed(session, tokens, n_past)

    def verify(self, session: Session, tokens: list[int], discard: bool) -> list[int]:
        return self.under.verify(session, tokens, discard)

    def decode(self, session: Session, token: int, count: int, stop_ids: set[int],
               pending: list[int], drafts: int) -> Iterator[int]:
        """The first stage decodes `count` tokens by itself. `drafts`: it speculates,
        drafting up to that many tokens per step from the history; a step then answers
        the drafts that held and one more token."""
        route = session.route
        request = loop_request(route, session.key(), token, len(session.history), count,
                               stop_ids, session.answer, drafts, session.history,
                               session.result.windows)
        stream = session.clients[0].forward_stream(request)
        produced = 0
        try:
            for response in stream:
                session.answered(response)
                check_chain(route, response)
                sampled = ([int(t) for t in response.sampled_tokens]
                           or [session.take_output(response, response.n_past - 1)])
                session.remember([pending[0], *sampled[:-1]])  # the fed token, the drafts that held
                pending[0] = sampled[-1]
                session.count_drafts(response.drafted_tokens, len(sampled) - 1)
                session.result.loop_depth = max(session.result.loop_depth, response.loop_depth)
                session.result.boundary_bytes += route.seam_bytes_per_token * (
                    len(route.stages) - 1) * (1 + response.drafted_tokens)
                for token_out in sampled:
                    produced += 1
                    yield token_out
                    if token_out in stop_ids or produced == count:
                        return
        finally:
            stream.cancel()
