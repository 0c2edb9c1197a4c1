"""What one request may ask of a route, checked before any template or tokenizing work
(pure): how big a body, how many messages, how many bytes of prompt can still fit the
route's context, and how many tokens a generation may produce after its prompt."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.route.errors import PromptTooLong

MAX_BODY_BYTES = 8 << 20  # beyond it: 413
MAX_MESSAGES = 2048  # per chat request, as OpenAI allows
MAX_CONTENT_PARTS = 2048  # text parts of all the messages together
DEFAULT_MAX_TOKENS = 256  # a request that names no max_tokens, when the context has room
# Every token of a vocabulary stands for at most this many bytes of text (SmolLM2's longest
# piece is 81: a newline and 80 spaces; special tokens are a few dozen), and the tokenizers
# we serve (BPE, SentencePiece) keep every byte, so a prompt of more bytes than
# n_ctx * MAX_TOKEN_BYTES has more tokens than the context holds: it is refused without
# being tokenized (tokenizing a prompt of special-token strings costs the first stage
# seconds per megabyte).
MAX_TOKEN_BYTES = 256


@dataclass(frozen=True)
class RouteBounds:
    """What the route's stages reported: the context one session holds, in tokens, and the
    size of the vocabulary (valid token ids are 0..n_vocab-1)."""

    n_ctx: int
    n_vocab: int

    @property
    def max_prompt_bytes(self) -> int:
        """A prompt (as UTF-8) longer than this cannot fit the context."""
        return self.n_ctx * MAX_TOKEN_BYTES


def completion_budget(asked: int | None, prompt_tokens: int, n_ctx: int) -> int:
    """How many tokens to generate after a prompt of `prompt_tokens`: `asked` (a client's
    max_tokens) when the context has room for all of them, else PromptTooLong, as OpenAI
    answers; unasked (None), DEFAULT_MAX_TOKENS or fewer, as many as the context has room
    for. The last token needs no position (it is never fed back), so a context of n_ctx
    holds a prompt of P tokens and n_ctx - P + 1 generated ones."""
    room = n_ctx - prompt_tokens + 1
    if room < 1:
        raise PromptTooLong(prompt_tokens, n_ctx)
    if asked is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if asked > room:
        raise PromptTooLong(prompt_tokens, n_ctx, asked)
    return asked
