"""Which cached prefix a new session starts from (docs/architecture.md, "Prefix cache"):
whole blocks of the route's prefix block, the longest that every stage holds. The session
tries the longest its prompt allows; a stage that lacks it answers CACHE_MISS naming the
longest it holds of those tokens (`prefix_held`), and the session tries that next, down to
a cold prefill. Pure: the session does the steps."""

from __future__ import annotations

from meshnet.route.errors import StageError


def first_try(prompt_tokens: int, block: int) -> int:
    """The longest reusable prefix of a prompt of `prompt_tokens`: whole blocks, leaving at
    least one token to compute (its logits answer the prefill)."""
    if block <= 0 or prompt_tokens <= 1:
        return 0
    return (prompt_tokens - 1) // block * block


def next_try(miss: StageError, tried: int, block: int) -> int:
    """After a try of `tried` tokens failed with `miss`: the shorter prefix every stage may
    still hold (what the refusing stage holds), or 0 (cold) when the failure says nothing
    about the cache."""
    held = miss.metadata.get("prefix_held") if miss.reason == "CACHE_MISS" else None
    if held is None or not held.isdigit() or block <= 0:
        return 0
    return min(int(held), tried - 1) // block * block
