"""The gateway's bounds on a request, pure: malformed or oversized bodies refused with the
reason before any template or tokenizing work, and max_tokens fitted to the context."""

from __future__ import annotations

import json

import pytest

from meshnet.gateway.limits import (
    DEFAULT_MAX_TOKENS,
    MAX_MESSAGES,
    MAX_TOKEN_BYTES,
    RouteBounds,
    completion_budget,
)
from meshnet.gateway.requests import BadRequest, chat_job, completion_job, read_json
from meshnet.route import PromptTooLong

ROUTE = RouteBounds(n_ctx=64, n_vocab=49152)


def chat(*messages: dict[str, object], **options: object) -> dict[str, object]:
    return {"model": "m", "messages": list(messages), **options}


def refused(parse: object, body: object) -> BadRequest:
    with pytest.raises(BadRequest) as error:
        parse(body, ROUTE)  # type: ignore[operator]
    return error.value


@pytest.mark.parametrize(("body", "where"), [
    (chat({"role": "user", "content": "a\ud800b"}), "messages[0].content"),
    (chat({"role": "user", "content": [{"type": "text", "text": "\udfff"}]}),
     "messages[0].content"),
    (chat({"role": "user", "content": "ok"}, {"role": "\ud800", "content": "x"}),
     "messages[1].role"),
    (chat({"role": "user", "content": "ok"}, stop=["\ud800"]), "a stop string"),
])
def test_a_lone_surrogate_in_a_chat_is_refused_naming_where(body: object, where: str) -> None:
    error = refused(chat_job, body)
    assert where in str(error) and "surrogate" in str(error)


def test_a_lone_surrogate_in_a_completion_prompt_is_refused() -> None:
    error = refused(completion_job, {"model": "m", "prompt": "x\ud800"})
    assert error.param == "prompt" and "surrogate" in str(error)


def test_a_body_nested_100000_deep_or_with_a_huge_number_is_not_json() -> None:
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"model": ' + b"9" * 5000 + b"}",
                b'{"model": "\xff"}', b"{not json"):
        with pytest.raises(BadRequest):
            read_json(raw)
    assert read_json(b'{"a": [[1]]}') == {"a": [[1]]}


def test_too_many_messages_or_content_parts_are_refused_before_reading_them() -> None:
    many = chat(*[{"role": "user", "content": "hi"}] * 100_000)
    error = refused(chat_job, many)
    assert error.param == "messages" and f"at most {MAX_MESSAGES}" in str(error)
    parts = [{"type": "text", "text": "a"}] * 1500
    error = refused(chat_job, chat({"role": "user", "content": parts},
                                   {"role": "user", "content": parts}))
    assert "content parts" in str(error)
    error = refused(chat_job, chat({"role": "user", "content": [{"type": "text", "text": [1]}]}))
    assert "only text" in str(error)


def test_a_prompt_with_more_bytes_than_the_context_can_hold_is_context_length_exceeded(
) -> None:
    limit = ROUTE.n_ctx * MAX_TOKEN_BYTES
    fits = "<|im_start|>" * (limit // 12 - 4)
    assert chat_job(chat({"role": "user", "content": fits}), ROUTE).messages
    assert completion_job({"model": "m", "prompt": fits}, ROUTE).prompt == fits
    flood = "<|im_start|>" * (limit // 12 + 1)
    for error in (refused(chat_job, chat({"role": "user", "content": flood})),
                  refused(completion_job, {"model": "m", "prompt": flood}),
                  refused(chat_job, chat(*[{"role": "u", "content": fits[:limit // 3]}] * 4))):
        assert error.code == "context_length_exceeded"
        assert f"context of {ROUTE.n_ctx} tokens" in str(error)
    # bytes, not characters: a character of four bytes counts four
    error = refused(completion_job, {"model": "m", "prompt": "\U0001f600" * (limit // 4 + 1)})
    assert error.code == "context_length_exceeded"


def test_token_ids_outside_the_vocabulary_or_past_the_context_are_refused() -> None:
    for ids in ([1, -2], [2**31], [2**63], [ROUTE.n_vocab], [1, 2, ROUTE.n_vocab + 7]):
        error = refused(completion_job, {"model": "m", "prompt": ids})
        assert error.param == "prompt" and "not a token id" in str(error), ids
        assert f"0..{ROUTE.n_vocab - 1}" in str(error)
    assert completion_job({"model": "m", "prompt": [ROUTE.n_vocab - 1]}, ROUTE).prompt == (
        ROUTE.n_vocab - 1,)
    error = refused(completion_job, {"model": "m", "prompt": [1] * (ROUTE.n_ctx + 1)})
    assert error.code == "context_length_exceeded"


def test_max_tokens_asked_must_fit_after_the_prompt_and_unasked_is_what_fits() -> None:
    n_ctx = 64
    # the last token needs no position: a prompt of P leaves n_ctx - P + 1
    assert completion_budget(10, 55, n_ctx) == 10
    assert completion_budget(None, 55, n_ctx) == 10
    assert completion_budget(None, 64, n_ctx) == 1
    assert completion_budget(None, 1, 4096) == DEFAULT_MAX_TOKENS
    with pytest.raises(PromptTooLong) as error:
        completion_budget(11, 55, n_ctx)
    assert (error.value.prompt_tokens, error.value.n_ctx, error.value.max_tokens) == (55, 64, 11)
    assert "at most 10 tokens after this prompt" in str(error.value)
    with pytest.raises(PromptTooLong) as error:
        completion_budget(None, 65, n_ctx)
    assert error.value.max_tokens is None and "65 tokens" in str(error.value)


def test_a_job_fits_its_max_tokens_to_the_prompt_it_got() -> None:
    body = {"model": "m", "prompt": "x"}
    unasked = completion_job(body, ROUTE)
    assert unasked.within_context(60).max_tokens == 5
    asked = completion_job({**body, "max_tokens": 6}, ROUTE)
    assert asked.within_context(59).max_tokens == 6
    with pytest.raises(PromptTooLong):
        asked.within_context(60)
    asked = completion_job({**body, "max_completion_tokens": 6, "max_tokens": 1}, ROUTE)
    assert asked.within_context(59).max_tokens == 6


def test_bounds_hold_for_json_as_a_client_would_send_it() -> None:
    """The surrogate as JSON escapes it (what every client sends) reaches the parser whole."""
    body = read_json(json.dumps(chat({"role": "user", "content": "\ud800"})).encode())
    assert "surrogate" in str(refused(chat_job, body))
