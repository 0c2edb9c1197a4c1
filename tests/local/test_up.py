"""`meshnet up` runs the example ShardRoute on loopback workers, follows edits of the
file with a new epoch, restarts dead workers, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from meshnet.gateway.routes import RouteHandle, local_route
from meshnet.local.registry import entry_route_key
from meshnet.local.registry import process_alive as pid_alive
from meshnet.route import StageClient

from .conftest import UpSession

PROMPT = "The three primary colors are"


def test_up_serves_the_three_stage_route_and_generate_finds_it_by_name(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    route = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    assert [s["layers"] for s in route["stages"]] == ["0:10", "10:20", "20:30"]
    for stage in route["stages"]:  # each worker knows what it serves, for the handshake
        info = StageClient(stage["endpoint"]).info()
        assert (info.manifest_digest, info.recipe_digest, info.route_digest) == (
            route["manifestDigest"], route["recipeDigest"], route["routeDigest"])

    answer = up.generate(PROMPT)

    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))
    assert answer["route"]["epoch"] == 1
    assert up.stop() == 0


def test_a_ring_route_is_ready_once_subscribed_and_decodes_on_the_ring_with_the_reference_tokens(
    make_up: Callable[..., UpSession], reference: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    up = make_up(topology="ring")
    route = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    head, middle, tail = (StageClient(s["endpoint"]).info() for s in route["stages"])
    endpoints = [s["endpoint"] for s in route["stages"]]
    assert [head.next_stage, middle.next_stage, tail.next_stage] == [*endpoints[1:], ""]
    assert (head.ring_last, head.ring_last_incarnation) == (endpoints[2], tail.incarnation)

    answer = up.generate(PROMPT)

    assert answer["topology"] == "ring"
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))
    monkeypatch.setenv("MESHNET_CACHE", str(up.cache))  # the gateway's view of the route
    # as `meshnet up`'s gateway: with the route's key, which the registry names
    gateway = RouteHandle(lambda: local_route("smollm2")()["0"],
                          route_key=entry_route_key(route))
    try:
        assert gateway.driver().topology_of(gateway.check()) == "ring"
    finally:
        gateway.close()


def test_a_resplit_ring_is_a_ring_of_the_new_epochs_workers(
    make_up: Callable[..., UpSession], reference: Callable[..., list[int]],
) -> None:
    up = make_up(topology="ring")
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    up.set_stages([("head", 0, 12), ("middle", 12, 20), ("tail", 20, 30)])  # the same names

    second = up.wait_for(lambda r: r["epoch"] == 2)

    endpoints = [s["endpoint"] for s in second["stages"]]
    assert not set(endpoints) & {s["endpoint"] for s in first["stages"]}
    head, middle, tail = (StageClient(e).info() for e in endpoints)
    assert [head.next_stage, middle.next_stage, head.ring_last] == [*endpoints[1:], endpoints[2]]
    assert head.ring_last_incarnation == tail.incarnation and tail.epoch == 2
    answer = up.generate(PROMPT)
    assert (answer["topology"], answer["route"]["epoch"]) == ("ring", 2)
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))


def test_a_topology_edit_relinks_the_stages_at_the_same_epoch_with_identical_text(
    make_up: Callable[..., UpSession], reference: Callable[..., list[int]],
) -> None:
    up = make_up(topology="ring")
    ring = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    up.set_topology("hub")

    hub = up.wait_for(lambda r: r["stages"][0]["pid"] != ring["stages"][0]["pid"])

    assert hub["epoch"] == 1
    assert [s["pid"] == old["pid"] for s, old in zip(hub["stages"], ring["stages"], strict=True)] \
        == [False, False, True]  # the tail links to nothing: it keeps running
    assert StageClient(hub["stages"][0]["endpoint"]).info().next_stage == ""
    answer = up.generate(PROMPT)
    assert answer["topology"] == "hub"
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))


def test_a_changed_layout_starts_epoch_two_with_identical_text(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    up.set_stages([("front", 0, 15), ("back", 15, 30)])

    second = up.wait_for(lambda r: r["epoch"] == 2)

    assert [s["layers"] for s in second["stages"]] == ["0:15", "15:30"]
    assert all(not pid_alive(s["pid"]) for s in first["stages"])
    answer = up.generate(PROMPT)
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))
    assert answer["route"]["epoch"] == 2
    assert "EpochAdvanced" in up.log.read_text()


def test_a_killed_worker_is_restarted_and_generation_stays_correct(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    route = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    victim = route["stages"][1]
    os.kill(victim["pid"], signal.SIGKILL)

    restarted = up.wait_for(
        lambda r: len(r["stages"]) == 3 and r["stages"][1]["pid"] != victim["pid"]
    )

    assert restarted["epoch"] == 1
    assert restarted["stages"][1]["endpoint"] == victim["endpoint"]  # on its port again
    answer = up.generate(PROMPT)
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))
    assert answer["recoveries"] == 0  # a new request after the restart: nothing to recover
    assert restarted["stages"][1]["restarts"] == 1
    assert "restart #1" in up.log.read_text()


def test_a_stage_that_keeps_crashing_exhausts_its_budget_and_up_exits_naming_its_log(
    make_up: Callable[..., UpSession],
) -> None:
    up = make_up("--restart-budget", "1")
    victim = up.wait_for(lambda r: len(r["stages"]) == 3)["stages"][1]
    os.kill(victim["pid"], signal.SIGKILL)
    again = up.wait_for(lambda r: len(r["stages"]) == 3 and r["stages"][1]["pid"] != victim["pid"])
    os.kill(again["stages"][1]["pid"], signal.SIGKILL)

    assert up.process.wait(timeout=60) == 1
    said = up.log.read_text()
    assert "restart #1 in 1s" in said
    gave_up = next(line for line in said.splitlines() if "not restarted again" in line)
    assert f"stage {victim['name']}: worker exited with code -9" in gave_up
    assert "restart budget 1" in gave_up
    worker_log = Path(gave_up.rsplit("its log: ", 1)[1])
    assert worker_log.read_text().count("listening") >= 2, "both runs' output is kept"
    assert not any(pid_alive(s["pid"]) for s in again["stages"])  # all stopped with it


def test_interrupting_up_stops_every_worker_and_withdraws_the_route(up: UpSession) -> None:
    route = up.wait_for(lambda r: len(r["stages"]) == 3)
    pids = [s["pid"] for s in route["stages"]]

    assert up.stop() == 0

    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)
    assert up.route() is None
    assert "stopped 3 workers" in up.log.read_text()


def test_a_killed_up_leaves_no_worker_behind(up: UpSession) -> None:
    route = up.wait_for(lambda r: len(r["stages"]) == 3)
    pids = [s["pid"] for s in route["stages"]]

    up.process.kill()  # no chance to stop its workers: they must notice by themselves
    up.process.wait()

    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)


def test_a_running_generate_recovers_when_up_restarts_a_killed_worker(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    route = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    running = subprocess.Popen(up.generate_command(PROMPT, max_tokens=200), env=up.env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    middle = StageClient(route["stages"][1]["endpoint"])
    deadline = time.monotonic() + 60
    while middle.capacity().active_sessions == 0:  # the generation is under way
        assert time.monotonic() < deadline and running.poll() is None
        time.sleep(0.05)
    middle.close()
    os.kill(route["stages"][1]["pid"], signal.SIGKILL)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    answer = json.loads(out)
    assert answer["recoveries"] >= 1
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))


def test_up_serves_the_route_over_the_openai_api(up: UpSession) -> None:
    up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    deadline = time.monotonic() + 60
    while True:
        try:
            models = httpx.get(up.gateway + "/models", timeout=5).json()["data"]
            if models:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, up.log.read_text()
        time.sleep(0.3)
    assert [m["id"] for m in models] == ["smollm2"]
    answer = httpx.post(up.gateway + "/completions", timeout=120, json={
        "model": "smollm2", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
    assert answer["usage"]["completion_tokens"] == 8
    assert f"OpenAI-compatible API: {up.gateway}" in up.log.read_text()


CODE = (  # code the model goes on repeating: prompt-lookup drafts hold
    "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
    "        total = total + value\n    return total\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n\n"
    "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
)


def worker_flags(pid: int) -> dict[str, str]:
    """The speculation flags a running worker was started with."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return {a: args[i + 1] for i, a in enumerate(args)
            if a in ("--max-loop-drafts", "--max-loop-windows", "--discard-depth")}


def test_a_speculation_edit_keeps_the_epoch_and_restarts_workers_and_gateway_speculating(
    make_up: Callable[..., UpSession],
) -> None:
    up = make_up(topology="ring")
    plain = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    assert [worker_flags(s["pid"]) for s in plain["stages"]] == [
        {"--max-loop-drafts": "0", "--max-loop-windows": "1"}, {}, {}]
    up.set_speculation({"mode": "Lookup", "maxDrafts": 4, "maxWindows": 2})

    edited = up.wait_for(lambda r: len(r["stages"]) == 3 and all(
        s["pid"] != old["pid"] for s, old in zip(r["stages"], plain["stages"], strict=True)))

    assert (edited["epoch"], edited["routeDigest"]) == (1, plain["routeDigest"])
    assert [worker_flags(s["pid"]) for s in edited["stages"]] == [
        {"--max-loop-drafts": "4", "--max-loop-windows": "2", "--discard-depth": "9"},
        {"--discard-depth": "9"}, {"--discard-depth": "9"}]
    deadline = time.monotonic() + 60
    while "restarting the gateway with --speculate 4 --windows 2" not in up.log.read_text():
        assert time.monotonic() < deadline, up.log.read_text()
        time.sleep(0.3)
    while True:  # the restarted gateway, once it sees the route
        try:
            if httpx.get(up.gateway + "/models", timeout=5).json()["data"]:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, up.log.read_text()
        time.sleep(0.3)
    answer = httpx.post(up.gateway + "/completions", timeout=120, json={
        "model": "smollm2", "prompt": CODE, "max_tokens": 32, "temperature": 0,
        "ignore_eos": True}).json()
    details = answer["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert answer["choices"][0]["text"] == up.generate(CODE, 32)["text"]  # plain decoding's


def test_up_s_gateway_queues_as_many_requests_as_spec_gateway_max_waiting(
    make_up: Callable[..., UpSession],
) -> None:
    """One session slot and `maxWaiting: 1`: one request runs, one waits, the next is 429
    (the gateway's own default would queue 16)."""
    up = make_up(spec={"gateway": {"maxWaiting": 1},
                       "recipe": {"lane": "cpu", "contextLength": 2048, "sessionSlots": 1}})
    up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    up.wait_for_gateway()
    release = threading.Event()
    answers: list[int] = []

    def hold() -> None:  # all 400 tokens (ignore_eos): the session stays busy until released
        with httpx.stream("POST", up.gateway + "/completions", timeout=300, json={
                "model": "smollm2", "prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}) as stream:
            for _ in stream.iter_lines():
                if release.is_set():
                    break

    def wait_in_line() -> None:
        answers.append(httpx.post(up.gateway + "/completions", timeout=300, json={
            "model": "smollm2", "prompt": PROMPT, "max_tokens": 4}).status_code)

    def gauge(name: str) -> float:
        metrics = httpx.get(up.gateway.removesuffix("/v1") + "/metrics", timeout=5).text
        for line in metrics.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return -1.0

    holder, waiter = threading.Thread(target=hold), threading.Thread(target=wait_in_line)
    try:
        holder.start()
        deadline = time.monotonic() + 60
        while gauge("meshnet_num_requests_running") != 1:
            assert time.monotonic() < deadline, up.log.read_text()
            time.sleep(0.1)
        waiter.start()
        while gauge("meshnet_num_requests_waiting") != 1:
            assert time.monotonic() < deadline, up.log.read_text()
            time.sleep(0.1)

        refused = httpx.post(up.gateway + "/completions", timeout=30, json={
            "model": "smollm2", "prompt": PROMPT, "max_tokens": 4})

        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        release.set()
        waiter.join(timeout=120)
        assert answers == [200]  # the one waiting runs once the slot is free
    finally:
        release.set()
        holder.join(timeout=120)
        if waiter.is_alive():
            waiter.join(timeout=120)
