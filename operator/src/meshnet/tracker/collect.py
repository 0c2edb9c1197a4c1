"""Asks every stage for GetInfo and GetCapacity at once, each call under a deadline, so a
hung or vanished worker costs one timeout and never stalls anything else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from meshnet.route.proto import pb, pb_grpc
from meshnet.tracker.inputs import StageSample, WorkerCapacity, WorkerInfo

DTYPES = {pb.BOUNDARY_DTYPE_F32: "f32", pb.BOUNDARY_DTYPE_F16: "f16",
          pb.BOUNDARY_DTYPE_BF16: "bf16"}


@dataclass(frozen=True)
class StageTls:
    """How a caller that dials stages by pod IP (the operator) reaches a route's stages over
    mTLS: the route's CA, its own client identity, and the name the stage certificate is
    checked against (a pod IP is in no certificate)."""

    ca: bytes
    cert: bytes
    key: bytes
    server_name: str

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)]


class StageChannels:
    """Long-lived channels, one per stage endpoint, with their stubs: opening a channel or
    building a stub costs far more CPU than the two calls made on it, and hundreds of
    routes are sampled every few seconds.
    A failed channel retries its connection within `retry_seconds` (so a stage that came
    back answers the next pass); one not asked for in `idle_seconds` is closed."""

    def __init__(self, retry_seconds: float = 5.0, idle_seconds: float = 60.0) -> None:
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_reconnect_backoff_ms", int(retry_seconds * 1000))]
        self._idle = idle_seconds
        # by endpoint and TLS (a route's renewed identity is a new channel)
        self._open: dict[tuple[str, StageTls | None], tuple[float, grpc.aio.Channel, Any]] = {}
        self._swept = time.monotonic()

    async def stub(self, endpoint: str, tls: StageTls | None = None) -> Any:
        """The endpoint's ShardService stub (over mTLS with `tls`)."""
        now = time.monotonic()
        key = (endpoint, tls)
        _, channel, stub = self._open.get(key) or (now, *_open(endpoint, tls, self._options))
        self._open[key] = (now, channel, stub)  # before any await: one per endpoint
        if now - self._swept > self._idle:
            self._swept = now
            for idle in [e for e, (used, *_) in self._open.items() if now - used > self._idle]:
                await self._open.pop(idle)[1].close()
        return stub

    async def close(self) -> None:
        for _, channel, _ in self._open.values():
            await channel.close()
        self._open.clear()


async def sample_stages(endpoints: Mapping[str, str | None], timeout: float = 2.0,
                        tls: StageTls | None = None,
                        channels: StageChannels | None = None) -> dict[str, StageSample]:
    """Samples of every stage that has an endpoint, by stage name; over `channels` when
    given, else over channels opened for this call."""
    names = [name for name, endpoint in endpoints.items() if endpoint]
    results = await asyncio.gather(*(sample_stage(str(endpoints[n]), timeout, tls,
                                                  channels) for n in names))
    return dict(zip(names, results, strict=True))


def _open(endpoint: str, tls: StageTls | None,
          options: list[tuple[str, Any]] | None = None) -> tuple[grpc.aio.Channel, Any]:
    channel = (grpc.aio.secure_channel(endpoint, tls.credentials(),
                                       [*(options or []), *tls.options()]) if tls
               else grpc.aio.insecure_channel(endpoint, options))
    return channel, pb_grpc.ShardServiceStub(channel)  # type: ignore[no-untyped-call]


async def sample_stage(endpoint: str, timeout: float = 2.0, tls: StageTls | None = None,
                       channels: StageChannels | None = None) -> StageSample:
    own = None  # a channel of this call only, closed after it
    if channels is not None:
        stub = await channels.stub(endpoint, tls)
    else:
        own, stub = _open(endpoint, tls)
    try:
        info, capacity = await asyncio.gather(
            stub.GetInfo(pb.GetInfoRequest(), timeout=timeout),
            stub.GetCapacity(pb.GetCapacityRequest(), timeout=timeout))
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        return StageSample(endpoint, error=f"{code}: {exc.details() or ''}".rstrip(": "))
    finally:
        if own is not None:
            await own.close()
    return StageSample(endpoint, info=worker_info(info), capacity=worker_capacity(capacity))


def worker_info(info: pb.GetInfoResponse) -> WorkerInfo:
    elements = 1
    for dim in info.boundary.row_shape:
        elements *= int(dim)
    return WorkerInfo(
        route_id=info.route_id, epoch=int(info.epoch), incarnation=info.incarnation,
        manifest_digest=info.manifest_digest, recipe_digest=info.recipe_digest,
        route_digest=info.route_digest, architecture=info.architecture,
        n_layer=int(info.n_layer), begin=int(info.layers.begin), end=int(info.layers.end),
        boundary_dtype=DTYPES.get(info.boundary.dtype, "f32"),
        boundary_row_elements=elements, exact_step_rows=int(info.exact_step_rows),
        exact_batching=info.exact_batching, throughput_batching=info.throughput_batching)


def worker_capacity(capacity: pb.GetCapacityResponse) -> WorkerCapacity:
    return WorkerCapacity(
        slots_free=int(capacity.slots_free), slots_total=int(capacity.slots_total),
        kv_tokens_free=int(capacity.kv_tokens_free),
        kv_tokens_total=int(capacity.kv_tokens_total),
        queue_depth=int(capacity.queue_depth), active_sessions=int(capacity.active_sessions),
        recent_tokens_per_second=float(capacity.recent_tokens_per_second),
        draft_tokens_verified=int(capacity.draft_tokens_verified),
        draft_tokens_accepted=int(capacity.draft_tokens_accepted))
