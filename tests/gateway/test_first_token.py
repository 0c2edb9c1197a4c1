"""The first token's path through the gateway: the prompt is tokenized and the first
token's text made in the generating thread. The text is unchanged (a first token that ends
inside a character included), and a prompt the first stage cannot tokenize still answers
503 with the route's reason, then serves again once the stage is back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from meshnet.gateway.fleet import Fleet
from meshnet.gateway.routes import fixed_replicas
from meshnet.gateway.server import Gateway, GatewayConfig, build_app
from meshnet.local.process import WorkerProcess, route_key_of
from meshnet.route import RouteDriver

from .conftest import MODEL
from .conftest import Gateway as ServedGateway

pytestmark = pytest.mark.slow

# first tokens that are part of an emoji ('' alone: whole with the next one, or two);
# Japanese text
PROMPTS = ["Emoji: 🙂🙂🙂", "🌍🌎🌏", "猫は"]


def streamed(url: str, prompt: str, max_tokens: int) -> tuple[list[str], int]:
    """The text pieces of a streamed greedy completion, and its completion_tokens."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    pieces, used = [], -1
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                pieces.append(chunk["choices"][0]["text"])
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
    return pieces, used


def test_streamed_and_whole_answers_are_meshnet_generates_text_whatever_the_first_token(
    gateway: ServedGateway, route: list[WorkerProcess],
) -> None:
    with RouteDriver([w.endpoint for w in route], route_key=route_key_of(route)) as driver:
        texts = [driver.generate(p, max_tokens=8).text for p in PROMPTS]  # greedy
    for prompt, expected in zip(PROMPTS, texts, strict=True):
        pieces, used = streamed(gateway.url, prompt, 8)
        assert "".join(pieces) == expected, prompt
        assert "\ufffd" not in "".join(pieces)  # no character broken between pieces
        whole = httpx.post(gateway.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}).json()
        assert whole["choices"][0]["text"] == expected, prompt
        assert whole["usage"]["completion_tokens"] == used


@pytest.fixture
async def in_process(route: list[WorkerProcess]) -> AsyncIterator[str]:
    """A gateway in this process whose probe does not come again during the test: a stage
    lost now is found by the request itself."""
    gateway = Gateway(GatewayConfig(model=MODEL, probe_seconds=3600),
                      Fleet(fixed_replicas([[w.endpoint for w in route]]),
                            route_key=route_key_of(route)))
    runner = web.AppRunner(build_app(gateway))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_prompt_the_first_stage_cannot_tokenize_is_a_503_and_the_route_serves_after(
    in_process: str, route: list[WorkerProcess],
) -> None:
    prompt = "The history of mapmaking is"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "stream": True}
    with RouteDriver([w.endpoint for w in route], route_key=route_key_of(route)) as driver:
        expected = driver.generate(prompt, max_tokens=4).text
    async with httpx.AsyncClient(base_url=in_process, timeout=120) as client:
        assert (await client.get("/ready")).status_code == 200  # the route as last probed
        route[0].kill()  # the stage that tokenizes
        try:
            refused = await client.post("/v1/completions", json=body)
        finally:
            route[0].start()
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "route_unavailable"
        assert "not servable" in error["message"] and route[0].endpoint in error["message"]
        metrics = (await client.get("/metrics")).text
        assert f'meshnet_requests_total{{route="{MODEL}",status="unavailable"}} 1.0' in metrics
        # the stage is back: served as soon as the gateway's channel has reconnected
        deadline = time.monotonic() + 60
        whole = {**body, "stream": False}
        while (served := await client.post("/v1/completions", json=whole)).status_code == 503:
            assert time.monotonic() < deadline, served.text
            await asyncio.sleep(0.2)
    assert served.status_code == 200
    assert served.json()["choices"][0]["text"] == expected
