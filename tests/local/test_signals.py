"""Started from a script's background, a process inherits SIGINT ignored (`make demo` did):
`meshnet up` and `meshnet serve` still stop on Ctrl-C, and `meshnet demo` stops what it
started, however it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from meshnet.local.process import free_port
from meshnet.local.registry import process_alive as pid_alive

from .conftest import UpSession, ignore_sigint


def gone(pids: list[int], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(pid_alive(p) for p in pids)


def refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=5)
    except httpx.ConnectError:
        return True
    return False


def test_up_started_with_sigint_ignored_stops_on_sigint(
        make_up: Callable[..., UpSession]) -> None:
    up = make_up(sigint_ignored=True)
    route = up.wait_for(lambda r: len(r["stages"]) == 3)
    up.wait_for_gateway()
    pids = [s["pid"] for s in route["stages"]]

    up.process.send_signal(signal.SIGINT)

    assert up.process.wait(timeout=60) == 0
    assert gone(pids)
    assert up.route() is None  # withdrawn
    assert refused(up.gateway + "/models")  # the gateway stopped with it
    assert "stopped 3 workers" in up.log.read_text()


def test_serve_started_with_sigint_ignored_stops_on_sigint(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with (tmp_path / "serve.log").open("w") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "meshnet.cli", "serve", "--scaled-to-zero",
             "--listen", listen], stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=ignore_sigint)
    try:
        deadline = time.monotonic() + 60
        while refused(f"http://{listen}/health"):
            assert time.monotonic() < deadline and serve.poll() is None, \
                (tmp_path / "serve.log").read_text()
            time.sleep(0.2)

        serve.send_signal(signal.SIGINT)

        assert serve.wait(timeout=30) == 0
        assert refused(f"http://{listen}/health")
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_an_interrupted_demo_stops_the_route_it_started(tmp_path: Path) -> None:
    """Interrupted while it asks the route (SIGINT ignored by inheritance, as under `make
    demo`), the demo stops `meshnet up`, which stops the gateway and the workers and
    withdraws the route."""
    cache = tmp_path / "cache"
    log = tmp_path / "demo.log"
    with log.open("w") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "meshnet.cli", "demo"], stdout=sink,
            stderr=subprocess.STDOUT, env={**os.environ, "MESHNET_CACHE": str(cache)},
            preexec_fn=ignore_sigint)
    entry_path = cache / "routes" / "smollm2.json"
    started: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                entry = json.loads(entry_path.read_text())
                break
            except (OSError, ValueError):
                assert time.monotonic() < deadline and demo.poll() is None, log.read_text()
                time.sleep(0.2)
        started += [entry["pid"], *(s["pid"] for s in entry["stages"])]  # up, its workers

        demo.send_signal(signal.SIGINT)

        assert demo.wait(timeout=120) == 130, log.read_text()
        assert gone(started), log.read_text()
        assert not entry_path.exists()  # withdrawn by `meshnet up` as it stopped
        assert refused(str(entry["gateway"]) + "/models")
        assert "stopping meshnet up" in log.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in started[:1]:  # a `meshnet up` left running; its workers go with it
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
