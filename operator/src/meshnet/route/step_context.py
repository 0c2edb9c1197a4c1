"""What a walk needs to carry one session's steps through a route, and nothing more: the
stages and their snapshot, the session's key, what the last stage answers, the tenant's
cache salt, and counters of what the steps cost. A walk gets it instead of the session,
and returns what it fed and sampled; the session keeps the history and recovers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.requests import Answer, Reuse
from meshnet.route.sampling import sample, verify_drafts
from meshnet.route.stage import StageClient


@dataclass
class StepCounts:
    """What a session's steps cost, as the walks count it (reported in its Generation)."""

    engine_seconds: float = 0.0  # every answered step's engine time, over its stages
    boundary_bytes: int = 0
    prefill_wavefront: bool = False  # a prefill's chunks were pipelined through the stages
    loop_depth: int = 0  # the most verify windows a decode loop kept in flight


@dataclass(frozen=True)
class StepContext:
    """One session's steps on one snapshot of the route (a recovery makes a new one)."""

    clients: Sequence[StageClient]
    route: RouteInfo
    key: pb.RouteKey
    answer: Answer
    # What the session's steps ask of the prefix cache where a feed is not given its own
    # (a prefill's): the tenant's salt, on verification and decoding steps.
    reuse: Reuse
    chunk_tokens: int | None = None  # the prefill's step size asked for (None: planned)
    counts: StepCounts = field(default_factory=StepCounts)

    def answered(self, response: pb.ForwardResponse) -> pb.ForwardResponse:
        """`response`, its stages' engine time counted."""
        self.counts.engine_seconds += sum(hop.engine_micros for hop in response.chain) * 1e-6
        return response

    def token_of(self, response: pb.ForwardResponse, position: int) -> int:
        """The token the last stage sampled, or sampled here from its logits."""
        if response.sampled_tokens:
            return int(response.sampled_tokens[0])
        logits = np.asarray(response.rows[0].logits, dtype=np.float32)
        return sample(logits, self.answer.sampling, position)

    def accepted(self, response: pb.ForwardResponse, tokens: list[int], n_past: int) -> list[int]:
        """The accepted drafts and the token after them, from the last stage's answer to a
        verification step of `tokens` at `n_past`: as it verified them, or verified here
        from every row's logits (the same rule)."""
        if response.sampled_tokens:
            return [int(t) for t in response.sampled_tokens]
        rows = np.asarray([row.logits for row in response.rows], dtype=np.float32)
        return verify_drafts(rows, tokens, self.answer.sampling,
                             list(range(n_past, n_past + len(tokens))))


@dataclass(frozen=True)
class DecodedStep:
    """One decode step as a walk returns it: the tokens it answered (the drafts that held,
    then one more) after the token it was fed, and the drafts it checked. The fed token
    and every answered token but the last are what the stages now hold."""

    sampled: list[int]
    drafted: int = 0
