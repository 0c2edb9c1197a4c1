"""Requests a route cannot serve as asked, through a real gateway on a real route with a
small context: a prompt past the context is 400 context_length_exceeded (never a route
failure), malformed bodies are 400 at once, a flood of prompts that cannot fit never
reaches the stage's tokenizer, and the route serves normally after each."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshnet.gateway.limits import MAX_BODY_BYTES, MAX_MESSAGES
from meshnet.local.process import WorkerProcess

from .conftest import MODEL, Gateway, key_args

pytestmark = pytest.mark.slow

CONTEXT = 256
N_VOCAB = 49152  # SmolLM2's
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~360 tokens


@pytest.fixture(scope="module")
def context_length() -> int:
    return CONTEXT


def post(gateway: Gateway, path: str, body: Any, timeout: float = 60) -> httpx.Response:
    """`body` as JSON escapes it (a lone surrogate as \\ud800), or raw bytes."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(gateway.base_url + path, content=content, timeout=timeout,
                      headers={"Content-Type": "application/json"})


def error_of(answer: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def requests_by_outcome(gateway: Gateway) -> dict[str, float]:
    counts = {}
    for line in httpx.get(gateway.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("meshnet_requests_total{"):
            counts[line.split('status="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


def tokenize_calls(stage: WorkerProcess) -> float:
    """Tokenize RPCs the stage has answered (its own metrics)."""
    text = httpx.get(f"http://127.0.0.1:{stage.metrics_port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('meshnet_shard_requests_total{rpc="Tokenize"'))


def assert_servable(gateway: Gateway, solo: Callable[..., str]) -> None:
    """The route still answers a legitimate request, with the solo model's text."""
    assert httpx.get(gateway.url + "/ready", timeout=10).status_code == 200
    answer = post(gateway, "/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                 "temperature": 0, "max_tokens": 16})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == solo(QUESTION, max_tokens=16)


def test_a_prompt_past_the_context_is_400_context_length_exceeded_not_a_route_failure(
    gateway: Gateway, solo: Callable[..., str],
) -> None:
    before = requests_by_outcome(gateway)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": LONG}]}
    for path, body in (("/chat/completions", chat),
                       ("/chat/completions", {**chat, "stream": True}),
                       ("/completions", {"model": MODEL, "prompt": LONG})):
        error = error_of(post(gateway, path, body))
        assert error["code"] == "context_length_exceeded"
        assert f"the route's context holds {CONTEXT}" in error["message"]
        assert "the prompt has" in error["message"]
    after = requests_by_outcome(gateway)
    assert after["bad_request"] - before["bad_request"] == 3
    assert after["unavailable"] == before["unavailable"]  # not the route's failure
    assert_servable(gateway, solo)


def test_max_tokens_past_the_context_is_refused_and_unasked_takes_what_fits(
    gateway: Gateway,
) -> None:
    prompt = list(range(1000, 1000 + CONTEXT - 4))  # room for 5 tokens (the last one needs
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "ignore_eos": True}  # no KV)
    error = error_of(post(gateway, "/completions", {**body, "max_tokens": 6}))
    assert error["code"] == "context_length_exceeded"
    assert "max_tokens is 6" in error["message"]
    assert "at most 5 tokens after this prompt" in error["message"]
    for asked in ({"max_tokens": 5}, {}):
        answer = post(gateway, "/completions", {**body, **asked})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 5
        assert answer.json()["choices"][0]["finish_reason"] == "length"
    error = error_of(post(gateway, "/completions", {**body, "prompt": [1] * (CONTEXT + 1)}))
    assert error["code"] == "context_length_exceeded"


def test_meshnet_generate_says_the_prompt_does_not_fit_in_one_line_and_exits_3(
    route: list[WorkerProcess],
) -> None:
    meshnet = Path(sys.executable).parent / "meshnet"
    stages = [arg for w in route for arg in ("--stage", w.endpoint)]
    result = subprocess.run([str(meshnet), "generate", *stages, *key_args(route), "--prompt", LONG],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the prompt has")
    assert f"the route's context holds {CONTEXT}" in lines[0]


def test_malformed_bodies_get_400_with_the_reason_at_once(
    gateway: Gateway, solo: Callable[..., str],
) -> None:
    chat = {"model": MODEL, "messages": QUESTION}
    cases: list[tuple[str, Any, str]] = [
        ("/completions", {"model": MODEL, "prompt": "a \ud800 b"}, "surrogate"),
        ("/chat/completions", {**chat, "messages": [{"role": "user", "content": "\ud800"}]},
         "messages[0].content holds a lone UTF-16 surrogate"),
        ("/chat/completions", {**chat, "messages": [{"role": "\udc00", "content": "hi"}]},
         "messages[0].role holds a lone UTF-16 surrogate"),
        ("/chat/completions", b"[" * 100_000 + b"]" * 100_000, "nests JSON too deeply"),
        ("/chat/completions", {**chat, "messages": QUESTION * 100_000},
         f"at most {MAX_MESSAGES}"),
        ("/completions", {"model": MODEL, "prompt": [1, 2**31]}, "prompt[1] = 2147483648"),
        ("/completions", {"model": MODEL, "prompt": [-1]}, "not a token id"),
        ("/completions", {"model": MODEL, "prompt": [5, N_VOCAB]},
         f"not a token id of the model (0..{N_VOCAB - 1})"),
    ]
    for path, body, reason in cases:
        error = error_of(post(gateway, path, body))
        assert reason in error["message"], (reason, error)
    error = error_of(post(gateway, "/completions", b"x" * (MAX_BODY_BYTES + 1)), 413)
    assert "larger than" in error["message"]
    assert_servable(gateway, solo)


def test_a_flood_of_prompts_that_cannot_fit_never_takes_the_route_down(
    gateway: Gateway, route: list[WorkerProcess], solo: Callable[..., str],
) -> None:
    """Four chats of 300,000 special-token strings each (3.6 MB, refused by their bytes
    alone: tokenizing one would keep the first stage busy for tens of seconds) and four
    of 5,000 (60 kB: tokenized, then refused), all at once, while /ready is watched."""
    before, tokenized = requests_by_outcome(gateway), tokenize_calls(route[0])
    floods = [{"model": MODEL, "messages": [{"role": "user", "content": "<|im_start|>" * n}]}
              for n in (300_000,) * 4 + (5_000,) * 4]
    watching = threading.Event()
    readiness: list[int] = []

    def watch() -> None:
        while not watching.is_set():
            readiness.append(httpx.get(gateway.url + "/ready", timeout=30).status_code)
            watching.wait(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(len(floods)) as pool:
            answers = list(pool.map(lambda body: post(gateway, "/chat/completions", body),
                                    floods))
    finally:
        watching.set()
        watcher.join()
    for answer in answers:
        assert error_of(answer)["code"] == "context_length_exceeded"
    assert tokenize_calls(route[0]) - tokenized <= 4  # never the 3.6 MB ones
    assert readiness and set(readiness) == {200}
    assert_servable(gateway, solo)
    after = requests_by_outcome(gateway)
    assert after["unavailable"] == before["unavailable"]
    assert after["bad_request"] - before["bad_request"] == len(floods)
