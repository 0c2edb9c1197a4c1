"""Draft tokens for speculative decoding, from the session's own context (pure, no model).

Prompt lookup: the longest suffix of the context (up to `max_ngram` tokens, at least
`min_ngram`) that occurred before proposes the tokens that followed its latest earlier
occurrence. Code editing, quoting and lists repeat their context, so such drafts often
hold; free text rarely repeats, and then no draft is offered at all.

The draft length adapts (`DraftLength`): it doubles after a step whose drafts all held
(a copied stretch goes on for a while), falls to what held after a rejection, and after
`patience` steps in a row with no draft accepted, drafting pauses for `pause` tokens
(doubling up to `max_pause` while probes keep failing) before it probes again. Every
decision is a function of the tokens alone, so a re-run (or a recovery) drafts the same
way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# A worker measures at start how wide a step it computes exactly (at most 8 rows: GetInfo
# exact_step_rows), so a verification step of a draft of up to 7 can compute every row
# exactly as a one-token decode step would; a route drafts fewer where a stage measured
# less (meshnet.route.exactness).
MAX_DRAFT = 7
# Verify windows a decode loop keeps in flight at most (ForwardRequest.loop_windows); the
# worker also caps them at drafts + 1, where a peer measured the gain saturate.
MAX_WINDOWS = 8


class PromptLookup:
    """An n-gram index over a growing token sequence: n-gram -> where the tokens after
    its latest occurrence begin."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("prompt lookup needs 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            # The n-grams ending just before this token now have a continuation: it.
            end = len(self.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._index[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(int(token))

    def draft(self, length: int) -> list[int]:
        """Up to `length` tokens that followed the longest earlier match of the context's
        suffix (empty when nothing matches)."""
        if length <= 0:
            return []
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            start = self._index.get(tuple(self.tokens[end - n:]))
            if start is not None:
                return self.tokens[start:start + length]
        return []


@dataclass
class DraftLength:
    """How many tokens to draft next, adapted to how the drafts fare."""

    start: int = 4
    most: int = MAX_DRAFT
    patience: int = 3  # steps in a row with nothing accepted before drafting pauses
    pause: int = 8  # tokens decoded plainly before the first probe
    max_pause: int = 64
    length: int = field(init=False)
    failures: int = field(default=0, init=False)
    paused_for: int = field(default=0, init=False)  # tokens still to decode plainly
    _next_pause: int = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.most:
            raise ValueError("a draft length needs 1 <= start <= most")
        self.length = self.start
        self._next_pause = self.pause

    def wanted(self) -> int:
        """Tokens to draft for the next step (0 while paused)."""
        return 0 if self.paused_for > 0 else self.length

    def decoded_plainly(self, tokens: int = 1) -> None:
        """`tokens` were decoded without a draft (paused, or no match)."""
        self.paused_for = max(0, self.paused_for - tokens)

    def verified(self, drafted: int, accepted: int) -> None:
        """A step verified `drafted` draft tokens, of which the first `accepted` held."""
        if drafted <= 0:
            return
        if accepted == drafted:
            self.length = min(self.most, self.length * 2)
        else:
            self.length = max(1, accepted)
        if accepted > 0:
            self.failures = 0
            self._next_pause = self.pause
            return
        self.failures += 1
        if self.failures >= self.patience:
            self.paused_for = self._next_pause
            self._next_pause = min(self.max_pause, self._next_pause * 2)
            self.failures = self.patience - 1  # a failing probe pauses again at once
