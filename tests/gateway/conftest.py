"""A real route (SmolLM2 as two chained workers on 127.0.0.1) behind a real `meshnet serve`
process, and the solo greedy answers its texts must equal."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.gateway.chat import chat_prompt, chat_tokens
from meshnet.local.process import LaunchSpec, WorkerProcess, free_port, route_key_of, start_route
from meshnet.route import RouteDriver
from meshnet.unsplit import unsplit_tokens

MODEL = "smollm2"
SLOTS = 4


@dataclass
class Gateway:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[str]
    log: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def key_args(workers: list[WorkerProcess]) -> list[str]:
    """serve's --route-key-file for the route the workers serve (none: no flag)."""
    key_file = workers[0].spec.route_key_file if workers else None
    return ["--route-key-file", str(key_file)] if key_file else []


def start_gateway(endpoints: list[str], log: Path, *extra: str) -> Gateway:
    port = free_port()
    args = [sys.executable, "-m", "meshnet.cli", "serve", "--model", MODEL,
            "--listen", f"127.0.0.1:{port}", *extra]
    for endpoint in endpoints:
        args += ["--stage", endpoint]
    sink = log.open("w")
    process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, text=True)
    gateway = Gateway(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"meshnet serve exited: {log.read_text()}")
        try:
            if httpx.get(gateway.url + "/ready", timeout=1).status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    gateway.stop()
    raise RuntimeError(f"meshnet serve was not ready in time: {log.read_text()}")


@pytest.fixture(scope="module")
def context_length() -> int:
    """The route's per-session context; a module may override it (a small one makes the
    end of the context cheap to reach)."""
    return 4096


@pytest.fixture(scope="module")
def route(shard_worker: Path, smollm2: Path, context_length: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/gateway", threads=1,
                        slots=SLOTS, ctx=context_length) for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("gateway-route"),
                          chain=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def gateway(route: list[WorkerProcess], tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[Gateway]:
    served = start_gateway([w.endpoint for w in route],
                           tmp_path_factory.mktemp("gateway") / "serve.log", *key_args(route))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def solo(route: list[WorkerProcess], smollm2: Path) -> Iterator[Callable[..., str]]:
    """The unsplit model's greedy answer to chat `messages` (or a completion `prompt`),
    as text: what every gateway answer with temperature 0 must equal."""
    with RouteDriver([w.endpoint for w in route], route_key=route_key_of(route)) as driver:
        template = driver.route.chat_template
        eos = set(driver.route.eos_token_ids)

        def answer(messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                   max_tokens: int = 32) -> str:
            if messages is not None:  # as the gateway: the messages' text stays text
                ids = chat_tokens(chat_prompt(template, messages),
                                  [m["content"] for m in messages], driver.tokenize)
            else:
                assert prompt is not None
                ids = driver.tokenize(prompt)
            tokens = unsplit_tokens(smollm2, ids, max_tokens)
            if eos & set(tokens):
                tokens = tokens[:min(tokens.index(t) for t in eos & set(tokens))]
            return driver.detokenize(tokens)

        yield answer
