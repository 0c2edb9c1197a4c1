"""Asks every stage for GetInfo and GetCapacity at once, each call under a deadline, so a
hung or vanished worker costs one timeout and never stalls anything else."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc

from meshnet.route.proto import pb, pb_grpc
from meshnet.tracker.inputs import StageSample, WorkerCapacity, WorkerInfo

DTYPES = {pb.BOUNDARY_DTYPE_F32: "f32", pb.BOUNDARY_DTYPE_F16: "f16",
          pb.BOUNDARY_DTYPE_BF16: "bf16"}


async def sample_stages(endpoints: Mapping[str, str | None], timeout: float = 2.0,
                        credentials: grpc.ChannelCredentials | None = None
                        ) -> dict[str, StageSample]:
    """Samples of every stage that has an endpoint, by stage name."""
    names = [name for name, endpoint in endpoints.items() if endpoint]
    results = await asyncio.gather(*(sample_stage(str(endpoints[n]), timeout, credentials)
                                     for n in names))
    return dict(zip(names, results, strict=True))


async def sample_stage(endpoint: str, timeout: float = 2.0,
                       credentials: grpc.ChannelCredentials | None = None) -> StageSample:
    channel = (grpc.aio.secure_channel(endpoint, credentials) if credentials
               else grpc.aio.insecure_channel(endpoint))
    try:
        stub = pb_grpc.ShardServiceStub(channel)  # type: ignore[no-untyped-call]
        info, capacity = await asyncio.gather(
            stub.GetInfo(pb.GetInfoRequest(), timeout=timeout),
            stub.GetCapacity(pb.GetCapacityRequest(), timeout=timeout))
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        return StageSample(endpoint, error=f"{code}: {exc.details() or ''}".rstrip(": "))
    finally:
        await channel.close()
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
        boundary_row_elements=elements)


def worker_capacity(capacity: pb.GetCapacityResponse) -> WorkerCapacity:
    return WorkerCapacity(
        slots_free=int(capacity.slots_free), slots_total=int(capacity.slots_total),
        kv_tokens_free=int(capacity.kv_tokens_free),
        kv_tokens_total=int(capacity.kv_tokens_total),
        queue_depth=int(capacity.queue_depth), active_sessions=int(capacity.active_sessions),
        recent_tokens_per_second=float(capacity.recent_tokens_per_second))
