"""Routes of real meshnet-shard-worker processes on 127.0.0.1 serving SmolLM2-135M, and
the unsplit reference (plain llama.cpp) they must agree with; and routes as a handshake
describes them, with no worker behind them, for the driver's pure parts."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route.handshake import RouteInfo, StageInfo
from meshnet.route.proto import pb

SPLIT = [(0, 10), (10, 20), (20, 30)]


def route_specs(model: Path, epoch: int = 1) -> list[LaunchSpec]:
    return [LaunchSpec(model=model, layers=LayerRange(*span), route_id="test/route", epoch=epoch,
                       threads=1)
            for span in SPLIT]


@pytest.fixture(scope="session")
def make_route_specs() -> Callable[[Path], list[LaunchSpec]]:
    return route_specs


@pytest.fixture(scope="module")
def three_stages(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 split 0:10, 10:20, 20:30, one thread each."""
    workers = start_route(shard_worker, route_specs(smollm2), tmp_path_factory.mktemp("route"))
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def three_stages_chained(shard_worker: Path, smollm2: Path,
                         tmp_path_factory: pytest.TempPathFactory,
                         ) -> Iterator[list[WorkerProcess]]:
    """The same split, each stage started with --next-stage (chain topology)."""
    workers = start_route(shard_worker, route_specs(smollm2), tmp_path_factory.mktemp("chain"),
                          chain=True)
    yield workers
    for worker in workers:
        worker.stop()



def stage_info(index: int, *, stages: int, chained: bool = False, ringed: bool = False,
               **changes: object) -> StageInfo:
    span = 30 // stages
    last = index == stages - 1
    stage = StageInfo(
        endpoint=f"127.0.0.1:{7001 + index}", begin=index * span,
        end=30 if last else (index + 1) * span, incarnation=f"inc-{index}",
        has_vocab=index == 0, needs_token_sideband=False,
        next_stage=f"127.0.0.1:{7002 + index}" if chained and not last else "",
        ring_last_incarnation=f"inc-{stages - 1}" if ringed and index == 0 else "",
        exact_step_rows=8, exact_batching=True,  # what a CPU worker measures
    )
    return replace(stage, **changes)  # type: ignore[arg-type]


def route_info(stages: int = 3, *, chained: bool = False, ringed: bool = False,
               **changes: object) -> RouteInfo:
    """A route as the handshake would describe it, with no worker behind it."""
    route = RouteInfo(
        route_id="test/route", epoch=1, manifest_digest="m" * 64, recipe_digest="r" * 64,
        route_digest="d" * 64, architecture="llama", n_layer=30, n_vocab=49152, n_ctx=2048,
        max_step_tokens=512, eos_token_ids=(2,),
        boundary_schema=pb.BOUNDARY_SCHEMA_DENSE_RESIDUAL, boundary_dtype=pb.BOUNDARY_DTYPE_F32,
        boundary_row_shape=(576,),
        stages=tuple(stage_info(i, stages=stages, chained=chained, ringed=ringed)
                     for i in range(stages)),
    )
    return replace(route, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def make_route_info() -> Callable[..., RouteInfo]:
    """route_info(stages=3, chained=False, ringed=False, **RouteInfo fields)."""
    return route_info


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer closes `sock` within `seconds` (a refusal that sends nothing)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
