"""The unsplit reference: one meshnet-shard-worker owning every layer of the model,
started beside the certifier on the route's own hardware."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS

REFERENCE_ROUTE = "meshnet-certify/reference"


@contextmanager
def reference_worker(binary: Path, model: Path, *, layers: int, ctx: int, threads: int,
                     backend: str, log: Path | None = None) -> Iterator[str]:
    """Starts it, owning all `layers` of the model, on a free loopback port and yields its
    endpoint; stops it on exit."""
    spec = LaunchSpec(model=model, layers=LayerRange(0, layers), route_id=REFERENCE_ROUTE, slots=1,
                      ctx=ctx, threads=threads, metrics_listen="",
                      gpu_layers=OFFLOAD_ALL_LAYERS if backend != "cpu" else 0)
    worker = WorkerProcess(binary, spec, log).start(timeout=600)
    try:
        yield worker.endpoint
    finally:
        worker.stop()
