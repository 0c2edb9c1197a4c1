"""Builds the Tracker report of one route from what was observed (pure: no I/O).

Availability is decided here, in one place: a route is available only when it is Ready,
every stage is ready, reachable and answers for this route and epoch, and its lane holds
a passing certificate. Otherwise every reason is listed and nothing is advertised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from meshnet.api.tracker import (
    ArtifactFacts,
    CapacityReport,
    CertificationState,
    LayerSpan,
    Provider,
    RecipeFacts,
    ReplicaReport,
    RouteCapacity,
    RouteIdentity,
    Seam,
    StageCapacity,
    StageHealth,
    StageLoad,
    StageReport,
    Unavailable,
)
from meshnet.certify import lane as lanes
from meshnet.timestamps import unix_rfc3339
from meshnet.tracker.inputs import (
    PinFacts,
    ReplicaView,
    RouteView,
    StageSample,
    StageView,
    WorkerInfo,
)

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def build_report(route: RouteView, stages: Sequence[StageView],
                 samples: Mapping[str, StageSample], certification: CertificationState, *,
                 provider: Provider, pin: PinFacts, sequence: int, now: float,
                 first_seen: Mapping[str, float],
                 replicas: Sequence[tuple[ReplicaView, Mapping[str, StageSample]]] | None = None
                 ) -> CapacityReport:
    """`samples` by stage name; `first_seen`: unix time each incarnation was first seen
    (uptime for workers whose start time the backend does not know). `replicas`: the
    ready replicas with their stages' samples (by stage name); when given they are listed
    and the route's capacity sums those whose pipeline is whole and consistent."""
    reasons: list[Unavailable] = []
    if route.deleting:
        reasons.append(Unavailable(reason="RouteDeleted", message="the route is being deleted"))
    elif not route.ready:
        reasons.append(Unavailable(reason="RouteNotReady",
                                   message=route.not_ready or "the route is not Ready"))
    reports = []
    for index, stage in enumerate(stages):
        sample = samples.get(stage.name)
        report, problem = _stage(route, stage, sample, index == len(stages) - 1, now,
                                 first_seen)
        reports.append(report)
        if problem is not None:
            reasons.append(problem)
    cert_reason, cert_message = lanes.verdict(certification)
    if cert_reason:
        reasons.append(Unavailable(reason=cert_reason,  # type: ignore[arg-type]
                                   message=cert_message))
    available = not reasons
    capacity = _route_capacity(reports, available)
    listed = None
    if replicas is not None:
        judged = [_replica(route, view, found, now, first_seen) for view, found in replicas]
        whole = [pipeline for report, pipeline in judged if report.ready]
        if whole:
            capacity = _sum(whole, available)
        listed = [report for report, _ in judged]
    architecture = route.architecture or next(
        (s.info.architecture for s in samples.values() if s.info and s.info.architecture), None)
    return CapacityReport(
        sequence=sequence, generated_at=unix_rfc3339(now),
        provider=provider,
        route=RouteIdentity(name=route.name, namespace=route.namespace, epoch=route.epoch,
                            route_digest=route.route_digest, endpoint=route.endpoint),
        artifact=ArtifactFacts(manifest_digest=route.manifest_digest,
                               architecture=architecture, block_count=route.block_count),
        recipe=RecipeFacts(recipe_digest=route.recipe_digest,
                           llama_cpp_commit=pin.llama_cpp_commit,
                           patch_stack_digest=pin.patch_stack_digest,
                           backend=route.recipe.lane, boundary_dtype=route.recipe.boundary_dtype,
                           context_length=route.recipe.context_length,
                           session_slots=route.recipe.session_slots,
                           batching=route.recipe.batching),
        stages=reports, capacity=capacity,
        replicas=listed,
        certification=certification, available=available, unavailable_reasons=reasons,
    )


def _stage(route: RouteView, stage: StageView, sample: StageSample | None, last: bool,
           now: float, first_seen: Mapping[str, float]) -> tuple[StageReport, Unavailable | None]:
    info = sample.info if sample else None
    capacity = sample.capacity if sample else None
    reachable = info is not None and capacity is not None
    problem: Unavailable | None = None
    if stage.endpoint is None:
        problem = Unavailable(reason="StageNotReady", stage=stage.name,
                              message=stage.problem or f"stage {stage.name} has no worker")
    elif not reachable:
        why = (sample.error if sample else None) or "no answer"
        problem = Unavailable(reason="StageUnreachable", stage=stage.name,
                              message=f"stage {stage.name} at {stage.endpoint}: {why}")
    elif info is not None and (mismatch := _mismatch(route, stage, info)):
        problem = Unavailable(reason="StageMismatch", stage=stage.name,
                              message=f"stage {stage.name} at {stage.endpoint}: {mismatch}")
    elif not stage.ready:
        problem = Unavailable(reason="StageNotReady", stage=stage.name,
                              message=stage.problem or f"stage {stage.name} is not ready")
    incarnation = info.incarnation if info else None
    started = stage.started_at
    if started is None and incarnation is not None:
        started = first_seen.get(incarnation)
    health = StageHealth(
        ready=problem is None, reachable=reachable, incarnation=incarnation,
        uptime_seconds=round(max(0.0, now - started), 1) if started is not None else None,
        restarts=stage.restarts, problem=problem.message if problem else None)
    report = StageReport(
        name=stage.name, layers=LayerSpan(begin=stage.begin, end=stage.end),
        endpoint=stage.endpoint, health=health,
        capacity=StageCapacity(
            session_slots_free=capacity.slots_free, session_slots_total=capacity.slots_total,
            kv_tokens_free=capacity.kv_tokens_free, kv_tokens_total=capacity.kv_tokens_total,
        ) if capacity else None,
        load=StageLoad(
            queue_depth=capacity.queue_depth, active_sessions=capacity.active_sessions,
            recent_tokens_per_second=round(capacity.recent_tokens_per_second, 2),
        ) if capacity else None,
        seam=Seam(
            boundary_bytes_per_token=0 if last else
            DTYPE_BYTES[info.boundary_dtype] * info.boundary_row_elements,
            dtype=info.boundary_dtype,  # type: ignore[arg-type]
        ) if info else None,
    )
    return report, problem


def _mismatch(route: RouteView, stage: StageView, info: WorkerInfo) -> str:
    """How the worker contradicts the route ('' when it does not). Digests are compared
    only when the worker was started with them."""
    found = []
    if info.route_id != route.route_id:
        found.append(f"serves route {info.route_id!r}, not {route.route_id!r}")
    if info.epoch != route.epoch:
        found.append(f"is at epoch {info.epoch}, the route at {route.epoch}")
    if (info.begin, info.end) != (stage.begin, stage.end):
        found.append(f"owns layers {info.begin}:{info.end}, not {stage.begin}:{stage.end}")
    for label, theirs, ours in (("manifest digest", info.manifest_digest, route.manifest_digest),
                                ("recipe digest", info.recipe_digest, route.recipe_digest),
                                ("route digest", info.route_digest, route.route_digest)):
        if theirs and ours and theirs != ours:
            found.append(f"has {label} {theirs[:12]}, not {ours[:12]}")
    return "; ".join(found)


def _route_capacity(stages: Sequence[StageReport], available: bool) -> RouteCapacity:
    caps = [s.capacity for s in stages if s.capacity is not None]
    loads = [s.load for s in stages if s.load is not None]
    whole = bool(stages) and len(caps) == len(stages)
    slots_free = min(c.session_slots_free for c in caps) if whole else None
    return RouteCapacity(
        session_slots_advertised=slots_free if available and slots_free is not None else 0,
        session_slots_free=slots_free,
        session_slots_total=min(c.session_slots_total for c in caps) if whole else None,
        kv_tokens_free=min(c.kv_tokens_free for c in caps) if whole else None,
        kv_tokens_total=min(c.kv_tokens_total for c in caps) if whole else None,
        queue_depth=max(load.queue_depth for load in loads) if whole else None,
        active_sessions=max(load.active_sessions for load in loads) if whole else None,
        recent_tokens_per_second=loads[-1].recent_tokens_per_second if whole else None,
    )


def _replica(route: RouteView, view: ReplicaView, samples: Mapping[str, StageSample],
             now: float, first_seen: Mapping[str, float]) -> tuple[ReplicaReport, RouteCapacity]:
    """One replica's pipeline, judged against its own epoch, and its capacity."""
    # An older epoch's pipeline answers for its own epoch, and its digests are not the
    # route's now.
    own = route if view.epoch == route.epoch else dataclasses.replace(
        route, epoch=view.epoch, route_digest=None, recipe_digest=None)
    checked = [_stage(own, stage, samples.get(stage.name), i == len(view.stages) - 1, now,
                      first_seen) for i, stage in enumerate(view.stages)]
    problems = [p.message for _, p in checked if p is not None]
    capacity = _route_capacity([r for r, _ in checked], not problems)
    return ReplicaReport(
        replica=view.replica, epoch=view.epoch, ready=bool(checked) and not problems,
        session_slots_free=capacity.session_slots_free,
        session_slots_total=capacity.session_slots_total,
        active_sessions=capacity.active_sessions,
        problem="; ".join(problems)[:4096] or None), capacity


def _sum(pipelines: Sequence[RouteCapacity], available: bool) -> RouteCapacity:
    """The route's capacity as the sum of its whole pipelines' (each a session's home)."""
    def total(field: str) -> int:
        return sum(int(getattr(c, field) or 0) for c in pipelines)

    free = total("session_slots_free")
    return RouteCapacity(
        session_slots_advertised=free if available else 0, session_slots_free=free,
        session_slots_total=total("session_slots_total"),
        kv_tokens_free=total("kv_tokens_free"), kv_tokens_total=total("kv_tokens_total"),
        queue_depth=total("queue_depth"), active_sessions=total("active_sessions"),
        recent_tokens_per_second=round(sum(c.recent_tokens_per_second or 0.0
                                           for c in pipelines), 2))


def withdrawn(last: CapacityReport, *, sequence: int, now: float) -> CapacityReport:
    """The route's last report turned into its withdrawal: the route is gone (deleted),
    so nothing may be routed to it whatever was measured before."""
    return last.model_copy(update={
        "sequence": sequence, "generated_at": unix_rfc3339(now), "available": False,
        "unavailable_reasons": [Unavailable(reason="RouteDeleted",
                                            message="the route was deleted")],
        "capacity": last.capacity.model_copy(update={"session_slots_advertised": 0}),
    })
