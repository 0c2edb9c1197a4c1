"""Exactness measured per stage, not assumed per lane (real SmolLM2 workers on loopback): a
CPU worker measures at start that steps of up to 8 rows give one-row steps' bits and that
sessions' rows in a shared step compute as alone, and says so in GetInfo; a stage that
claims no exact step (--exact-batch-rows 0) makes the route decode plainly with the reason
shown in `meshnet generate --json`, and its tokens are plain decoding's; a stage started
with --batching throughput says so, and so does the route's output."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, StageClient

pytestmark = pytest.mark.slow

# Code the model goes on repeating: prompt lookup would draft here.
PROMPT = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
          "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
TOKENS = 24


@pytest.fixture(scope="module")
def one_stage_claims_nothing(shard_worker: Path, smollm2: Path,
                             tmp_path_factory: pytest.TempPathFactory,
                             ) -> Iterator[list[WorkerProcess]]:
    """0:15 as started by default, 15:30 with --exact-batch-rows 0 and --batching
    throughput (a chain)."""
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(0, 15), route_id="test/exact",
                        threads=1, ctx=256),
             LaunchSpec(model=smollm2, layers=LayerRange(15, 30), route_id="test/exact",
                        threads=1, ctx=256,
                        extra=("--exact-batch-rows", "0", "--batching", "throughput"))]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("exact"), chain=True)
    yield workers
    for worker in workers:
        worker.stop()


def test_a_cpu_worker_measures_8_exact_rows_and_exact_batching_and_keeps_no_trace(
    one_stage_claims_nothing: list[WorkerProcess],
) -> None:
    first, second = (StageClient(w.endpoint) for w in one_stage_claims_nothing)
    try:
        measured = first.info(timeout=5)
        assert (measured.exact_step_rows, measured.exact_batching) == (8, True)
        assert "steps of 1..8 rows give one-row steps' bits" in measured.exactness_detail
        assert "4 sessions' rows in one step compute as alone" in measured.exactness_detail
        assert not measured.throughput_batching
        claimed = second.info(timeout=5)
        assert (claimed.exact_step_rows, claimed.exact_batching) == (0, False)
        assert "--exact-batch-rows 0" in claimed.exactness_detail
        assert claimed.throughput_batching
        for client in (first, second):  # the probe's positions are nobody's
            capacity = client.capacity()
            assert capacity.kv_tokens_free == capacity.kv_tokens_total
            assert capacity.slots_free == capacity.slots_total
    finally:
        first.close()
        second.close()


def test_a_stage_without_an_exact_window_gets_plain_decoding_with_the_reason_shown(
    one_stage_claims_nothing: list[WorkerProcess],
) -> None:
    endpoints = [w.endpoint for w in one_stage_claims_nothing]
    shown = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "generate", *(f"--stage={e}" for e in endpoints),
         "--prompt", PROMPT, "--max-tokens", str(TOKENS), "--ignore-eos", "--speculate", "7",
         "--route-key-file", str(one_stage_claims_nothing[0].spec.route_key_file),
         "--json"], capture_output=True, text=True, timeout=120, check=True)
    spoken = json.loads(shown.stdout)
    assert spoken["speculate"] == 0 and spoken["draft_tokens"] == 0
    assert spoken["speculation_limit"] == "not_exact"
    assert spoken["speculation_reason"].startswith(
        f"plain decoding: stage {endpoints[1]} (layers 15:30) measured exact steps of at most "
        "0 rows, a window of 7 drafts is 8")
    assert [s["exact_step_rows"] for s in spoken["route"]["stages"]] == [8, 0]
    assert [s["throughput_batching"] for s in spoken["route"]["stages"]] == [False, True]
    assert spoken["load_dependent"] is True  # its tokens may depend on the load
    with RouteDriver(endpoints, route_key=route_key_of(one_stage_claims_nothing)) as driver:
        plain = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False)
    assert spoken["tokens"] == plain.tokens
