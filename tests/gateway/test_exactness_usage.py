"""A gateway asked to speculate over a route one of whose stages measured no exact verify
window (--exact-batch-rows 0) decodes plainly and says why: in the answer's usage
(meshnet_exactness) and in /metrics (meshnet_speculation_limited_total{reason}); its text
is plain decoding's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver

from .conftest import MODEL, Gateway, key_args, start_gateway

pytestmark = pytest.mark.slow

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def inexact_route(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(0, 15), route_id="test/gw-exact",
                        threads=1, ctx=256),
             LaunchSpec(model=smollm2, layers=LayerRange(15, 30), route_id="test/gw-exact",
                        threads=1, ctx=256, extra=("--exact-batch-rows", "0"))]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("gw-exact"), chain=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def speculating_gateway(inexact_route: list[WorkerProcess],
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    served = start_gateway([w.endpoint for w in inexact_route],
                           tmp_path_factory.mktemp("gw-exact") / "serve.log", "--speculate", "7",
                           *key_args(inexact_route))
    yield served
    served.stop()


def test_usage_and_metrics_say_why_the_route_decoded_plainly(
    inexact_route: list[WorkerProcess], speculating_gateway: Gateway,
) -> None:
    answer = httpx.post(speculating_gateway.base_url + "/completions", timeout=60, json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}).json()
    said = answer["usage"]["meshnet_exactness"]
    assert said["speculation_limit"] == "not_exact"
    assert said["speculation_reason"].startswith(
        f"plain decoding: stage {inexact_route[1].endpoint} (layers 15:30) measured exact "
        "steps of at most 0 rows")
    assert "completion_tokens_details" not in answer["usage"]  # no draft was verified
    metrics = httpx.get(speculating_gateway.url + "/metrics", timeout=5).text
    assert 'meshnet_speculation_limited_total{reason="not_exact",route=' in metrics
    counted = [line for line in metrics.splitlines()
               if line.startswith("meshnet_speculation_limited_total{reason=\"not_exact\"")]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) == 1.0
    with RouteDriver([w.endpoint for w in inexact_route],
                     route_key=route_key_of(inexact_route)) as driver:
        plain = driver.generate(PROMPT, max_tokens=12, stop_at_eos=True)
    assert answer["choices"][0]["text"] == plain.text
