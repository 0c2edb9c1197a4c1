"""What a gateway client sees when the route loses a stage: a clear 503 while it is down,
the same text when a stage is killed and comes back in the middle of a stream, and a
/v1/models that answers while a stage is frozen."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route.driver import INFO_TIMEOUT

from .conftest import MODEL, Gateway, key_args, start_gateway

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


@pytest.fixture
def served(shard_worker: Path, smollm2: Path, tmp_path: Path,
           ) -> Iterator[tuple[list[WorkerProcess], Gateway]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/gateway-failures",
                        threads=1) for span in [(0, 10), (10, 20), (20, 30)]]
    workers = start_route(shard_worker, specs, tmp_path, chain=True)
    gateway = start_gateway([w.endpoint for w in workers], tmp_path / "serve.log",
                            *key_args(workers))
    yield workers, gateway
    gateway.stop()
    for worker in workers:
        worker.stop()


def wait_for_ready(gateway: Gateway, status: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(gateway.url + "/ready", timeout=5).status_code == status:
            return True
        time.sleep(0.2)
    return False


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def stream_text(gateway: Gateway, on_chunk: object = None) -> str:
    pieces = []
    stream = client(gateway).chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=48,  # type: ignore[arg-type]
        stream=True)
    for index, chunk in enumerate(stream):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if on_chunk is not None and index == 6:
            on_chunk()  # type: ignore[operator]
    return "".join(pieces)


def chat_refusal(gateway: Gateway) -> tuple[int, str | None, str]:
    reply = httpx.post(gateway.base_url + "/chat/completions", timeout=INFO_TIMEOUT - 1,
                       json={"model": MODEL, "messages": QUESTION, "max_tokens": 4})
    return reply.status_code, reply.headers.get("Retry-After"), reply.text


def test_a_stage_that_is_down_gives_503_with_a_clear_message(
    served: tuple[list[WorkerProcess], Gateway],
) -> None:
    workers, gateway = served
    workers[1].kill()
    assert wait_for_ready(gateway, 503)  # the gateway's probe noticed (every 2 s)
    with pytest.raises(openai.InternalServerError) as unavailable:
        client(gateway).chat.completions.create(model=MODEL, messages=QUESTION,  # type: ignore[arg-type]
                                                max_tokens=4)
    assert unavailable.value.status_code == 503
    assert "not servable" in str(unavailable.value)
    assert client(gateway).models.list().data == []
    assert httpx.get(gateway.url + "/health", timeout=5).status_code == 200
    workers[1].start()
    assert wait_for_ready(gateway, 200)
    assert [m.id for m in client(gateway).models.list().data] == [MODEL]


def test_a_stage_killed_mid_stream_costs_no_text(
    served: tuple[list[WorkerProcess], Gateway],
) -> None:
    workers, gateway = served
    expected = stream_text(gateway)

    def kill_middle_then_restart() -> None:
        workers[1].kill()
        threading.Timer(0.5, workers[1].start).start()

    assert stream_text(gateway, kill_middle_then_restart) == expected


def test_models_answers_from_the_last_check_while_a_stage_is_frozen(
    served: tuple[list[WorkerProcess], Gateway],
) -> None:
    """A handshake would wait INFO_TIMEOUT on the frozen stage for each of 32 clients; the
    last probe's answer comes at once (for /v1/models and for chats: 503 with Retry-After),
    and the route is listed and serves again once it thaws."""
    workers, gateway = served
    assert [m.id for m in client(gateway).models.list().data] == [MODEL]

    def models() -> int:
        return httpx.get(gateway.base_url + "/models", timeout=INFO_TIMEOUT - 1).status_code

    os.kill(workers[1].pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(32) as pool:
            assert list(pool.map(lambda _: models(), range(32))) == [200] * 32
        assert wait_for_ready(gateway, 503)  # the probe found the frozen stage
        assert client(gateway).models.list().data == []
        # requests are answered from the probe's finding too, not each after a handshake
        # of its own that would wait INFO_TIMEOUT on the frozen stage
        with ThreadPoolExecutor(16) as pool:
            refusals = list(pool.map(lambda _: chat_refusal(gateway), range(16)))
        assert {(status, retry) for status, retry, _ in refusals} == {(503, "2")}
        assert all("not servable" in message for _, _, message in refusals)
    finally:
        os.kill(workers[1].pid, signal.SIGCONT)
    assert wait_for_ready(gateway, 200)
    assert [m.id for m in client(gateway).models.list().data] == [MODEL]
    assert stream_text(gateway)  # the route serves again
