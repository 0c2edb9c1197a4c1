"""`meshnet up` with replicas: one pipeline of workers per replica on loopback, one gateway
that spreads sessions over them, finishes a session on the other replica when its own
dies (the same text, waiting for a slot there when every one is taken), drains a replica
scaled away before stopping it, and answers 503 while the route is scaled to zero."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from .conftest import UpSession, start_up

PROMPTS = ["The three primary colors are", "Once upon a time, in a small village,",
           "The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 12
STREAM_TOKENS = 64  # the 8 concurrent streams': long enough to be cut mid-way


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpSession]:
    up = start_up(tmp_path_factory.mktemp("up-replicas"), replicas=2)
    up.wait_for(lambda r: len(r["replicas"]) == 2)
    wait_until_serving(up, replicas=2)
    yield up
    try:
        up.stop()
    except subprocess.TimeoutExpired:
        up.process.kill()
        up.process.wait()


def wait_until_serving(up: UpSession, replicas: int, timeout: float = 120) -> None:
    """Until the gateway finds `replicas` replicas ready."""
    url = up.gateway.removesuffix("/v1") + "/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=2)
            if answer.status_code == 200 and answer.json()["replicas"] == replicas:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the gateway never had {replicas} replicas ready:\n{up.log.read_text()}")


def complete(up: UpSession, prompt: str, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    return httpx.post(up.gateway + "/completions", timeout=300, json={
        "model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})


def metric(up: UpSession, name: str, **labels: str) -> float:
    text = httpx.get(up.gateway.removesuffix("/v1") + "/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(r"(\S+?)\{(.*)\} (\S+)", line)
        if match and match[1] == name and ",".join(sorted(match[2].split(","))) == wanted:
            return float(match[3])
    return 0.0


def taken(up: UpSession, replica: str) -> float:
    return metric(up, "meshnet_replica_sessions_total", replica=replica, route="smollm2")


def test_concurrent_requests_are_spread_over_both_replicas_with_the_solo_text(
        fleet: UpSession) -> None:
    solo = {p: complete(fleet, p).json()["choices"][0]["text"] for p in PROMPTS}
    before = [taken(fleet, "0"), taken(fleet, "1")]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: complete(fleet, p), PROMPTS * 2))

    assert [a.status_code for a in answers] == [200] * 8
    assert [a.json()["choices"][0]["text"] for a in answers] == [solo[p] for p in PROMPTS * 2]
    spread = [taken(fleet, "0") - before[0], taken(fleet, "1") - before[1]]
    assert sum(spread) == 8 and min(spread) >= 2, spread  # 4 slots each: both took sessions


def test_a_stream_whose_replica_loses_a_stage_finishes_on_the_other_with_the_same_text(
        fleet: UpSession) -> None:
    prompt, max_tokens = PROMPTS[1], 40
    solo = complete(fleet, prompt, max_tokens).json()["choices"][0]["text"]
    moves = metric(fleet, "meshnet_session_moves_total", route="smollm2")
    entry = fleet.route()
    assert entry is not None

    pieces: list[str] = []
    victim: dict[str, Any] = {}
    with httpx.stream("POST", fleet.gateway + "/completions", timeout=300, json={
            "model": "smollm2", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            pieces.append(line)
            if len(pieces) == 3:  # mid-stream: kill the middle stage of the replica serving it
                running = {r: metric(fleet, "meshnet_replica_requests_running",
                                     replica=r, route="smollm2") for r in ("0", "1")}
                victim = next(r for r in entry["replicas"] if running[str(r["replica"])] == 1)
                os.kill(victim["stages"][1]["pid"], signal.SIGKILL)

    chunks = [json.loads(p.removeprefix("data: ")) for p in pieces]
    assert all("error" not in c for c in chunks), chunks
    assert "".join(c["choices"][0]["text"] for c in chunks) == solo
    assert metric(fleet, "meshnet_session_moves_total", route="smollm2") == moves + 1
    other = str(1 - victim["replica"])
    assert metric(fleet, "meshnet_replica_ready", replica=other, route="smollm2") == 1
    # the killed worker is restarted by up, and its replica serves again
    fleet.wait_for(lambda r: len(r["replicas"]) == 2 and all(
        s["pid"] != victim["stages"][1]["pid"] for x in r["replicas"] for s in x["stages"]))
    wait_until_serving(fleet, replicas=2)


@pytest.fixture(scope="module")
def solo_streams(fleet: UpSession) -> dict[str, str]:
    """Each prompt's text alone on the route, as the 8 streams ask for it."""
    return {p: complete(fleet, p, STREAM_TOKENS).json()["choices"][0]["text"] for p in PROMPTS}


def eight_streams(up: UpSession, meanwhile: Callable[[], None]) -> list[tuple[int, str, list[Any]]]:
    """PROMPTS twice as 8 concurrent streams (4 slots on each of the 2 replicas: every slot
    taken); `meanwhile` runs once each has its first text, and before any has ended. Each
    stream's status, text and error chunks."""
    started = threading.Barrier(9, timeout=300)
    ended: list[float] = []

    def stream(prompt: str) -> tuple[int, str, list[Any]]:
        text, errors, first = "", [], True
        with httpx.stream("POST", up.gateway + "/completions", timeout=300, json={
                "model": "smollm2", "prompt": prompt, "max_tokens": STREAM_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True}) as response:
            if response.status_code != 200:
                started.abort()
                return response.status_code, response.read().decode(), []
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    errors.append(chunk["error"])
                    continue
                text += chunk["choices"][0]["text"]
                if first and text:
                    first = False
                    started.wait()
        if first:
            started.abort()  # it ended without text: nothing to wait for
        ended.append(time.monotonic())
        return response.status_code, text, errors

    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, p) for p in PROMPTS * 2]
        started.wait()
        running = [metric(up, "meshnet_replica_requests_running", replica=r, route="smollm2")
                   for r in ("0", "1")]
        assert running == [4, 4], running  # both replicas full: a moved session must wait
        acted = time.monotonic()
        meanwhile()
        answers = [s.result() for s in streams]
    assert len(ended) == 8 and min(ended) > acted, "a stream ended before the change it tests"
    return answers


def test_eight_streams_all_finish_with_the_solo_text_when_a_stage_of_a_full_replica_dies(
        fleet: UpSession, solo_streams: dict[str, str]) -> None:
    """Its 4 sessions move to the other replica, whose 4 slots are all taken: they wait
    for one there (or for their own replica's restart) instead of failing with 503."""
    entry = fleet.route()
    assert entry is not None and len(entry["replicas"]) == 2
    victim = entry["replicas"][0]["stages"][0]  # the head: it tokenizes and decodes

    answers = eight_streams(fleet, lambda: os.kill(victim["pid"], signal.SIGKILL))

    assert [(status, errors) for status, _, errors in answers] == [(200, [])] * 8, answers
    assert [text for _, text, _ in answers] == [solo_streams[p] for p in PROMPTS * 2]
    fleet.wait_for(lambda r: len(r["replicas"]) == 2 and all(
        s["pid"] != victim["pid"] for x in r["replicas"] for s in x["stages"]))
    wait_until_serving(fleet, replicas=2)


def test_eight_streams_all_finish_on_their_replica_when_it_is_scaled_away(
        fleet: UpSession, solo_streams: dict[str, str]) -> None:
    """Scaling 2 -> 1 drains replica 1: the gateway sends it no new session, its running
    ones finish there (none is moved), and only then are its workers stopped."""
    entry = fleet.route()
    assert entry is not None and len(entry["replicas"]) == 2
    removed = [s["pid"] for s in entry["replicas"][1]["stages"]]
    moves = metric(fleet, "meshnet_session_moves_total", route="smollm2")
    alive_when_withdrawn: list[bool] = []

    def scale_down() -> None:
        fleet.set_replicas(1)
        fleet.wait_for(lambda r: len(r["replicas"]) == 1, timeout=60)
        alive_when_withdrawn.extend(_alive(pid) for pid in removed)

    answers = eight_streams(fleet, scale_down)

    assert [(status, errors) for status, _, errors in answers] == [(200, [])] * 8, answers
    assert [text for _, text, _ in answers] == [solo_streams[p] for p in PROMPTS * 2]
    assert alive_when_withdrawn == [True] * 3  # withdrawn from the gateway, still serving
    assert metric(fleet, "meshnet_session_moves_total", route="smollm2") == moves
    assert "replica 1 drained" in fleet.said("replica 1 drained")
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in removed):
        assert time.monotonic() < deadline, "the drained replica's workers still run"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_route_scaled_to_zero_answers_503_with_retry_after_then_serves_once_scaled_up(
        fleet: UpSession) -> None:
    solo = complete(fleet, PROMPTS[2]).json()["choices"][0]["text"]
    unavailable = metric(fleet, "meshnet_requests_total", route="smollm2", status="unavailable")

    fleet.set_replicas(0)
    fleet.wait_for(lambda r: r["replicas"] == [])
    deadline = time.monotonic() + 30
    while "scaled to zero" not in (refused := complete(fleet, PROMPTS[2])).text:
        assert time.monotonic() < deadline, f"not found scaled to zero: {refused.text}"
        time.sleep(0.2)  # until the gateway's probe reads the registry again
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert "scaled to zero" in refused.json()["error"]["message"]
    assert metric(fleet, "meshnet_requests_total", route="smollm2",
                  status="unavailable") > unavailable  # the demand KEDA wakes it on

    fleet.set_replicas(1)
    fleet.wait_for(lambda r: len(r["replicas"]) == 1)
    wait_until_serving(fleet, replicas=1)
    served = complete(fleet, PROMPTS[2])
    assert served.status_code == 200
    assert served.json()["choices"][0]["text"] == solo
