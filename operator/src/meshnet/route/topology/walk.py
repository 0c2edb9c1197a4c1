"""A walk: how a session's steps go through the route in one topology. Every topology
implements the same three steps on a StepContext, so the session feeds, verifies and
decodes without knowing which one it walks; each step returns what it sampled, and the
session keeps the history."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Protocol

from meshnet.api.common import Topology
from meshnet.route.requests import Reuse
from meshnet.route.step_context import DecodedStep, StepContext


class Walk(Protocol):
    topology: Topology  # what the generation reports
    loops: bool  # the first stage decodes by itself

    def feed(self, ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse) -> int:
        """Runs `tokens` (at positions from `n_past`) through every stage, its requests
        asking the prefix cache for `reuse`; the token sampled after the last."""
        ...

    def verify(self, ctx: StepContext, tokens: list[int], n_past: int,
               discard: bool) -> list[int]:
        """One verification step of `tokens` (the last token and its drafts) at `n_past`;
        the accepted drafts and the token after them. `discard`: the stages first drop
        what they hold from `n_past` on. Its requests ask for the session's reuse
        (StepContext.reuse), as a decode's do."""
        ...

    def decode(self, ctx: StepContext, token: int, history: Sequence[int], count: int,
               stop_ids: set[int], drafts: int, windows: int) -> Generator[DecodedStep]:
        """The steps of decoding up to `count` tokens after `token` (fed at
        len(`history`)), ending after a stop id; a walk that loops drafts up to `drafts`
        tokens per step from `history` with up to `windows` verify windows in flight. A
        failure propagates: the session recovers."""
        ...
