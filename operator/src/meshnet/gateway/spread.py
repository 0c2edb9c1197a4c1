"""Which replica of a route a new session goes to: pure functions of what the gateway knows
(each replica's free session slots) and of the conversation, so a chat's turns stay on the
replica that served it while it has room."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """A ready replica as the picker sees it."""

    name: str  # the replica's label ("0", "1", ...)
    free: int  # session slots not held by a running request


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
    """The replica with the most free slots (ties: the conversation's favourite); None when
    no replica has a free slot."""
    free = [c for c in candidates if c.free > 0]
    if not free:
        return None
    return max(free, key=lambda c: (c.free, affinity(key, c.name)))
