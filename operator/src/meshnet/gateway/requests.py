"""OpenAI request bodies (/v1/chat/completions, /v1/completions) read into one typed Job,
or refused with the message a client needs (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshnet.route.sampling import Sampling

MAX_STOP_STRINGS = 4  # as OpenAI allows
DEFAULT_MAX_TOKENS = 256


class BadRequest(ValueError):
    """The body cannot be served as asked; `param` names the field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Job:
    """One generation a request asks for."""

    kind: str  # "chat" | "completion"
    model: str
    messages: tuple[Mapping[str, Any], ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # completion: text or token ids
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False  # an extension (as vLLM's): generate all max_tokens


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number", name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low:g} and {high:g}, got {value}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, low: int,
             high: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer", name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}", name)
    return value


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    """Options we cannot honour are refused, never silently ignored."""
    if _integer(body, "n", 1, 1, 128) != 1:
        raise BadRequest("n > 1 is not supported: send one request per choice", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise BadRequest(f"{name} is not supported (only 0)", name)
    for name in ("logprobs", "echo", "tools", "functions", "logit_bias", "suffix"):
        if body.get(name) not in (None, False, 0, [], {}):
            raise BadRequest(f"{name} is not supported", name)
    if body.get("top_logprobs") not in (None, 0):
        raise BadRequest("top_logprobs is not supported", "top_logprobs")


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"stop takes at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(stops)


def _common(body: Mapping[str, Any], max_context: int, default_seed: int) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required: GET /v1/models lists it", "model")
    _refuse_unsupported(body)
    max_tokens = _integer(body, "max_completion_tokens", None, 1, max_context)
    if max_tokens is None:
        # unasked, never more than the route's context holds
        max_tokens = _integer(body, "max_tokens", min(DEFAULT_MAX_TOKENS, max_context), 1,
                              max_context)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    top_k = _integer(body, "top_k", 0, 0, 1 << 20)  # an extension, as vLLM and llama.cpp take it
    seed = _integer(body, "seed", default_seed, 0, 2**64 - 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be true or false", "ignore_eos")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise BadRequest("stream_options must be an object", "stream_options")
    if options and not stream:
        raise BadRequest("stream_options needs stream: true", "stream_options")
    return {
        "model": model,
        "max_tokens": max_tokens,
        "sampling": Sampling(temperature=temperature, top_k=top_k or 0, top_p=top_p,
                             seed=seed if seed is not None else default_seed),
        "stop": _stop(body),
        "stream": stream,
        "include_usage": bool(options.get("include_usage", False)),
        "ignore_eos": ignore_eos,
    }


def chat_job(body: Any, max_context: int, default_seed: int = 0) -> Job:
    """A /v1/chat/completions body; BadRequest says what is wrong with it. `default_seed`
    serves a request that names none (OpenAI: a fresh draw each time)."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}] needs a role", "messages")
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
                raise BadRequest(f"messages[{index}]: only text content is supported",
                                 "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{index}].content must be text", "messages")
        checked.append({"role": message["role"], "content": content})
    return Job(kind="chat", messages=tuple(checked), **_common(body, max_context, default_seed))


def completion_job(body: Any, max_context: int, default_seed: int = 0) -> Job:
    """A /v1/completions body; BadRequest says what is wrong with it."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return Job(kind="completion", prompt=tuple(prompt),
                   **_common(body, max_context, default_seed))
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string (or a list of token ids)", "prompt")
    return Job(kind="completion", prompt=prompt, **_common(body, max_context, default_seed))
