"""Which replica of a route a new session goes to: pure functions of what the gateway knows
(each replica's free session slots, the prompts it served last) and of the conversation, so
a request goes where its prompt's prefix may already be cached and a chat's turns stay on
the replica that served it while it has room."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Prompts a replica's record keeps: about what its stages' prefix caches can hold.
RECENT_PROMPTS = 32
# Shared characters below this count as none: fewer than one prefix block (128 tokens by
# default, some 4 characters each) cannot be reused, and every chat shares a few.
REUSABLE_CHARACTERS = 256


@dataclass(frozen=True)
class Candidate:
    """A ready replica as the picker sees it."""

    name: str  # the replica's label ("0", "1", ...)
    free: int  # session slots not held by a running request
    shared: int = 0  # characters this request's prompt shares with one the replica served


class RecentPrompts:
    """The prompts a replica served last: a hint of the prefixes its stages' caches hold.
    An entry evicted since costs a cold prefill there, never a different token."""

    def __init__(self, keep: int = RECENT_PROMPTS) -> None:
        self._texts: deque[str] = deque(maxlen=keep)

    def remember(self, text: str) -> None:
        if text:
            self._texts.append(text)

    def shared(self, text: str) -> int:
        """The longest start of `text` one of the recent prompts has (0 below
        REUSABLE_CHARACTERS)."""
        longest = max((common_start(seen, text) for seen in self._texts), default=0)
        return longest if longest >= REUSABLE_CHARACTERS else 0


def common_start(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share (by bisection: slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def prompt_text(kind: str, messages: Sequence[Mapping[str, Any]],
                prompt: str | Sequence[int]) -> str:
    """A request's prompt as text whose prefixes compare as the rendered prompt's do: a
    chat's messages in order, a completion's prompt."""
    if kind == "chat":
        return "".join(f"\x1e{m.get('role')}\x1f{m.get('content')}" for m in messages)
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))


def conversation_key(kind: str, messages: Sequence[Mapping[str, Any]],
                     prompt: str | Sequence[int]) -> str:
    """What stays the same over a conversation's turns: a chat's first user message (the
    later turns repeat it), else the whole completion prompt."""
    if kind == "chat":
        for message in messages:
            if message.get("role") == "user":
                return str(message.get("content"))
        return ""
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))


def affinity(key: str, replica: str) -> int:
    """Rendezvous (highest random weight) score of `replica` for `key`: a conversation's
    favourite among equals moves only when its replica goes, not when another comes."""
    digest = hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def pick(candidates: Sequence[Candidate], key: str) -> Candidate | None:
    """The replica with the most free slots; among equals the one whose recent prompts share
    the longest start with this one (its prefix cache may hold it), then the conversation's
    favourite. None when no replica has a free slot."""
    free = [c for c in candidates if c.free > 0]
    if not free:
        return None
    return max(free, key=lambda c: (c.free, c.shared, affinity(key, c.name)))
