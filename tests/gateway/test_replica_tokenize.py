"""A replica that died since the gateway's last probe fails the new session's Tokenize: the
session is tokenized and served on another ready replica, with the same text, not 503."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx

from meshnet.api.shardroute import LayerRange
from meshnet.gateway.spread import affinity
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route

from .conftest import MODEL, SLOTS, key_args, start_gateway


def replica_values(url: str, metric: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {m[1]: float(m[2]) for m in re.finditer(
        rf'^{metric}{{[^}}]*replica="(\d+)"[^}}]*}} (\S+)$', text, re.MULTILINE)}


def test_a_prompt_a_just_died_replica_cannot_tokenize_is_served_by_another_replica(
        shard_worker: Path, smollm2: Path, route: list[WorkerProcess],
        solo: Callable[..., str], tmp_path: Path) -> None:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/gateway",
                        threads=1, slots=SLOTS, ctx=4096) for span in [(0, 15), (15, 30)]]
    (tmp_path / "doomed").mkdir()
    # a replica of the same route: its key too
    specs = [replace(spec, route_key_file=route[0].spec.route_key_file) for spec in specs]
    doomed = start_route(shard_worker, specs, tmp_path / "doomed", chain=True)
    gateway = start_gateway([], tmp_path / "serve.log", *key_args(route),
                            "--replica", ",".join(w.endpoint for w in doomed),
                            "--replica", ",".join(w.endpoint for w in route))
    try:
        deadline = time.monotonic() + 30
        while replica_values(gateway.url, "meshnet_replica_ready") != {"0": 1.0, "1": 1.0}:
            assert time.monotonic() < deadline, "both replicas ready"
            time.sleep(0.1)
        # a prompt whose conversation the spread sends to replica 0 (both have every slot)
        prompt = next(p for p in (f"List {n} fruits:" for n in range(100))
                      if affinity(p, "0") > affinity(p, "1"))
        for worker in doomed:
            worker.kill()
        answer = httpx.post(gateway.base_url + "/completions", timeout=60, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == solo(prompt=prompt, max_tokens=16)
        assert replica_values(gateway.url, "meshnet_replica_sessions_total").get("1") == 1.0
        assert replica_values(gateway.url, "meshnet_replica_ready")["0"] == 0.0
    finally:
        gateway.stop()
        for worker in doomed:
            worker.stop()
