"""OpenAI request bodies (/v1/chat/completions, /v1/completions) read into one typed Job,
or refused with the message a client needs (pure: no I/O). Every bound of
meshnet.gateway.limits is checked here, before any template or tokenizing work."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshnet.gateway.limits import (
    DEFAULT_MAX_TOKENS,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_TOKEN_BYTES,
    RouteBounds,
    completion_budget,
)
from meshnet.route.sampling import Sampling

MAX_STOP_STRINGS = 4  # as OpenAI allows
MAX_SALT_BYTES = 256


ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


class BadRequest(ValueError):
    """The body cannot be served as asked; `param` names the field (OpenAI's error.param),
    `code` the reason when a client may act on it (OpenAI's error.code)."""

    def __init__(self, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def read_json(raw: bytes) -> Any:
    """The body's JSON; BadRequest when it is not JSON, or nests deeper than the parser's
    recursion limit (about 1,000 levels: the parser stops there, at once)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadRequest("the body nests JSON too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, a 5,000-digit number
        raise BadRequest(f"the body is not valid JSON: {exc}") from None


def _utf8_size(text: str, param: str, where: str) -> int:
    """Bytes of `text` as the stages get it (UTF-8): a lone UTF-16 surrogate has none."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest(f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which "
                         "is not text", param) from None


def _prompt_size_fits(size: int, bounds: RouteBounds, param: str) -> None:
    """Refuses, untokenized, a prompt too big for any tokenizing to fit the context."""
    if size > bounds.max_prompt_bytes:
        raise BadRequest(f"the prompt has more than {bounds.max_prompt_bytes} bytes, more "
                         f"than the route's context of {bounds.n_ctx} tokens can hold (a "
                         f"token stands for at most {MAX_TOKEN_BYTES} bytes): shorten the "
                         "prompt", param, "context_length_exceeded")


@dataclass(frozen=True)
class Job:
    """One generation a request asks for."""

    kind: str  # "chat" | "completion"
    model: str
    messages: tuple[Mapping[str, Any], ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # completion: text or token ids
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_asked: bool = False  # named by the client: refused when it does not fit
    n_ctx: int = 0  # the route's context, as the body was checked against it
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False  # an extension (as vLLM's): generate all max_tokens
    cache_salt: str = ""  # the client's (OpenAI's and vLLM's): its prefixes are its own

    def within_context(self, prompt_tokens: int) -> Job:
        """This job for a prompt of `prompt_tokens`: its max_tokens fitted to the context
        (limits.completion_budget); PromptTooLong when it cannot be."""
        asked = self.max_tokens if self.max_tokens_asked else None
        return dataclasses.replace(
            self, max_tokens=completion_budget(asked, prompt_tokens, self.n_ctx))


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
    for stop in stops:
        _utf8_size(stop, "stop", "a stop string")
    return tuple(stops)


def _common(body: Mapping[str, Any], bounds: RouteBounds, default_seed: int) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required: GET /v1/models lists it", "model")
    _refuse_unsupported(body)
    max_tokens = _integer(body, "max_completion_tokens", None, 1, bounds.n_ctx)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, bounds.n_ctx)
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
    cache_salt = body.get("cache_salt") or ""
    if not isinstance(cache_salt, str) or _utf8_size(
            cache_salt, "cache_salt", "cache_salt") > MAX_SALT_BYTES:
        raise BadRequest(f"cache_salt must be a string of at most {MAX_SALT_BYTES} bytes",
                         "cache_salt")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise BadRequest("stream_options must be an object", "stream_options")
    if options and not stream:
        raise BadRequest("stream_options needs stream: true", "stream_options")
    return {
        "model": model,
        # unasked: fitted to what the context leaves after the prompt (Job.within_context)
        "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "max_tokens_asked": max_tokens is not None,
        "n_ctx": bounds.n_ctx,
        "sampling": Sampling(temperature=temperature, top_k=top_k or 0, top_p=top_p,
                             seed=seed if seed is not None else default_seed),
        "stop": _stop(body),
        "stream": stream,
        "include_usage": bool(options.get("include_usage", False)),
        "ignore_eos": ignore_eos,
        "cache_salt": cache_salt,
    }


def _content(message: Mapping[str, Any], where: str, parts_left: int) -> tuple[str, int]:
    """A message's text and the number of content parts it used."""
    content = message.get("content", "")
    if not isinstance(content, list):  # content parts: text only
        if not isinstance(content, str):
            raise BadRequest(f"{where}.content must be text", "messages")
        return content, 0
    if len(content) > parts_left:
        raise BadRequest(f"the messages have more than {MAX_CONTENT_PARTS} content parts",
                         "messages")
    if not all(isinstance(p, Mapping) and p.get("type") == "text"
               and isinstance(p.get("text", ""), str) for p in content):
        raise BadRequest(f"{where}: only text content is supported", "messages")
    return "".join(p.get("text", "") for p in content), len(content)


def chat_job(body: Any, bounds: RouteBounds, default_seed: int = 0) -> Job:
    """A /v1/chat/completions body; BadRequest says what is wrong with it. `default_seed`
    serves a request that names none (OpenAI: a fresh draw each time)."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"messages holds {len(messages)} messages, at most {MAX_MESSAGES} "
                         "are served", "messages")
    checked = []
    size, parts_left = 0, MAX_CONTENT_PARTS
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise BadRequest(f"{where} needs a role", "messages")
        content, parts = _content(message, where, parts_left)
        parts_left -= parts
        size += _utf8_size(message["role"], "messages", f"{where}.role")
        if not ROLE.fullmatch(message["role"]):
            # the template writes the role into the prompt as it is, special tokens and all
            raise BadRequest(f"{where}.role must be a plain name (a letter, then letters, "
                             "digits, '_' or '-'; at most 64), as OpenAI's roles are", "messages")
        size += _utf8_size(content, "messages", f"{where}.content")
        _prompt_size_fits(size, bounds, "messages")  # the template only adds to it
        checked.append({"role": message["role"], "content": content})
    return Job(kind="chat", messages=tuple(checked), **_common(body, bounds, default_seed))


def _token_ids(prompt: list[Any], bounds: RouteBounds) -> tuple[int, ...]:
    if len(prompt) > bounds.n_ctx:
        raise BadRequest(f"the prompt has {len(prompt)} tokens, the route's context holds "
                         f"{bounds.n_ctx}", "prompt", "context_length_exceeded")
    for index, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int):
            raise BadRequest("prompt must be a non-empty string (or a list of token ids)",
                             "prompt")
        if not 0 <= token < bounds.n_vocab:
            raise BadRequest(f"prompt[{index}] = {token} is not a token id of the model "
                             f"(0..{bounds.n_vocab - 1})", "prompt")
    return tuple(prompt)


def completion_job(body: Any, bounds: RouteBounds, default_seed: int = 0) -> Job:
    """A /v1/completions body; BadRequest says what is wrong with it."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
        return Job(kind="completion", prompt=_token_ids(prompt, bounds),
                   **_common(body, bounds, default_seed))
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string (or a list of token ids)", "prompt")
    _prompt_size_fits(_utf8_size(prompt, "prompt", "the prompt"), bounds, "prompt")
    return Job(kind="completion", prompt=prompt, **_common(body, bounds, default_seed))
