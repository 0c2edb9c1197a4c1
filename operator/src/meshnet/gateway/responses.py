"""Response bodies as OpenAI shapes them: completions, stream chunks, usage, errors (pure)."""

from __future__ import annotations

import json
from typing import Any


def usage(prompt_tokens: int, completion_tokens: int,
          drafts: tuple[int, int] | None = None, cached_tokens: int | None = 0,
          exactness: dict[str, Any] | None = None) -> dict[str, Any]:
    """`drafts`: (drafted, accepted) tokens of speculative decoding, reported as OpenAI
    reports predicted outputs (completion_tokens_details). `cached_tokens`: prompt tokens
    taken from the stages' prefix cache (prompt_tokens_details, as OpenAI reports them);
    None where the route keeps them out of responses. `exactness`: what the route could not
    promise (see `exactness`), as `meshnet_exactness`; None when nothing."""
    used: dict[str, Any] = {"prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        used["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if drafts is not None:
        drafted, accepted = drafts
        used["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                             "rejected_prediction_tokens": drafted - accepted}
    if exactness:
        used["meshnet_exactness"] = exactness
    return used


def exactness(speculation_limit: str, speculation_reason: str,
              load_dependent: bool) -> dict[str, Any] | None:
    """Why the route speculated less than asked (meshnet.route.exactness), and whether
    the tokens may depend on the load (a stage batches for throughput); None when the
    route kept every promise as asked."""
    said: dict[str, Any] = {}
    if speculation_limit:
        said["speculation_limit"] = speculation_limit
        said["speculation_reason"] = speculation_reason
    if load_dependent:
        said["load_dependent"] = True
    return said or None


def completion(kind: str, request_id: str, model: str, created: int, text: str,
               finish_reason: str, used: dict[str, int]) -> dict[str, Any]:
    """The whole answer of a non-streaming request."""
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None,
                                  "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None, "text": text}
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model,
            "choices": [choice], "usage": used}


def chunk(kind: str, request_id: str, model: str, created: int, text: str | None,
          finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
    """One streamed piece: text, or the last piece with its finish_reason."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model,
            "choices": [choice]}


def usage_chunk(kind: str, request_id: str, model: str, created: int,
                used: dict[str, int]) -> dict[str, Any]:
    """stream_options.include_usage: the chunk before [DONE], no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model,
            "choices": [], "usage": used}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line ([DONE] as is)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


# OpenAI error types by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               413: "invalid_request_error",
               429: "rate_limit_exceeded", 500: "server_error", 503: "service_unavailable"}


def error(status: int, message: str, code: str | None = None,
          param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}
