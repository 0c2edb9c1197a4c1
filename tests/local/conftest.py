"""`meshnet up` as a user runs it: a real process serving the example route file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from meshnet.local.process import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "local" / "smollm2-3stage.yaml"


@dataclass
class UpSession:
    """A running `meshnet up` with its own cache (route registry, logs) and storage."""

    route_file: Path
    cache: Path
    process: subprocess.Popen[str]
    log: Path
    gateway: str  # the OpenAI base URL `meshnet up --serve` serves the route on

    def env(self) -> dict[str, str]:
        return {**os.environ, "MESHNET_CACHE": str(self.cache)}

    def route(self) -> dict[str, Any] | None:
        path = self.cache / "routes" / "smollm2.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def wait_for(
        self, ready: Callable[[dict[str, Any]], bool], timeout: float = 180
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"meshnet up exited {self.process.returncode}:\n{self.log.read_text()}")
            route = self.route()
            if route and ready(route):
                return route
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for the route:\n{self.log.read_text()}")

    def said(self, text: str, timeout: float = 60) -> str:
        """The first line of up's output holding `text`, once it says it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"meshnet up exited {self.process.returncode}:\n{self.log.read_text()}")
            found = [line for line in self.log.read_text().splitlines() if text in line]
            if found:
                return found[0]
            time.sleep(0.1)
        pytest.fail(f"meshnet up never said {text!r}:\n{self.log.read_text()}")

    def wait_for_gateway(self, timeout: float = 60) -> None:
        """Until the gateway `meshnet up --serve` started lists the route's model."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.gateway + "/models", timeout=5).json()["data"]:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                pytest.fail(f"the gateway never served the route:\n{self.log.read_text()}")
            time.sleep(0.3)

    def stages_text(self, stages: list[tuple[str, int, int]]) -> str:
        """The route file's text with these stages (not written)."""
        docs = list(yaml.safe_load_all(self.route_file.read_text()))
        docs[1]["spec"]["stages"] = [
            {"name": n, "layers": {"begin": b, "end": e}} for n, b, e in stages
        ]
        return yaml.safe_dump_all(docs, sort_keys=False)

    def set_stages(self, stages: list[tuple[str, int, int]]) -> None:
        self.route_file.write_text(self.stages_text(stages))

    def set_topology(self, topology: str) -> None:
        docs = list(yaml.safe_load_all(self.route_file.read_text()))
        docs[1]["spec"]["recipe"]["topology"] = topology
        self.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def set_replicas(self, replicas: int) -> None:
        docs = list(yaml.safe_load_all(self.route_file.read_text()))
        docs[1]["spec"]["replicas"] = replicas
        self.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def set_speculation(self, speculation: dict[str, Any]) -> None:
        docs = list(yaml.safe_load_all(self.route_file.read_text()))
        docs[1]["spec"]["recipe"]["speculation"] = speculation
        self.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def generate_command(self, prompt: str, max_tokens: int = 24) -> list[str]:
        return [sys.executable, "-m", "meshnet.cli", "generate", "--route", "smollm2",
                "--prompt", prompt, "--max-tokens", str(max_tokens), "--ignore-eos", "--json"]

    def generate(self, prompt: str, max_tokens: int = 24) -> dict[str, Any]:
        result = subprocess.run(self.generate_command(prompt, max_tokens), env=self.env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)


def ignore_sigint() -> None:
    """As a script's background job starts: Ctrl-C ignored (inherited across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_up(tmp_path: Path, *extra: str, topology: str | None = None,
             replicas: int | None = None, spec: dict[str, Any] | None = None,
             sigint_ignored: bool = False) -> UpSession:
    """`meshnet up` on a copy of the example route file, with `extra` flags (and the
    recipe's `topology`, the route's `replicas` and other `spec` fields, where given),
    started with SIGINT ignored if `sigint_ignored`."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    docs[0]["spec"]["storage"]["hostPath"]["path"] = str(tmp_path / "models")
    if topology is not None:
        docs[1]["spec"]["recipe"]["topology"] = topology
    if replicas is not None:
        docs[1]["spec"]["replicas"] = replicas
    docs[1]["spec"].update(spec or {})
    route_file = tmp_path / "route.yaml"
    route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    log = tmp_path / "up.log"
    cache = tmp_path / "cache"
    serve = f"127.0.0.1:{free_port()}"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "meshnet.cli", "up", "-f", str(route_file),
             "--threads", "1", "--interval", "0.3", "--serve", serve, *extra],
            env={**os.environ, "MESHNET_CACHE": str(cache)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=ignore_sigint if sigint_ignored else None,
        )
    return UpSession(route_file, cache, process, log, f"http://{serve}/v1")


@pytest.fixture
def make_up(tmp_path: Path) -> Iterator[Callable[..., UpSession]]:
    started: list[UpSession] = []

    def make(*extra: str, topology: str | None = None, spec: dict[str, Any] | None = None,
             sigint_ignored: bool = False) -> UpSession:
        started.append(start_up(tmp_path, *extra, topology=topology, spec=spec,
                                sigint_ignored=sigint_ignored))
        return started[-1]

    yield make
    for session in started:
        try:
            session.stop()  # as a user would: its workers stop with it
        except subprocess.TimeoutExpired:
            session.process.kill()
            session.process.wait()


@pytest.fixture
def up(make_up: Callable[..., UpSession]) -> UpSession:
    return make_up()
