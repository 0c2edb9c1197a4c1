"""What the planner cannot see from the API server: whether a draining pipeline still
holds sessions. Its stages are asked (GetCapacity, at their pod IPs, under a deadline)
only while a pipeline drains; one that does not answer counts as busy, so a pipeline goes
early only on every stage's word and otherwise at the end of its drain."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from meshnet.reconcile.route import ObservedPod
from meshnet.reconcile.route.rollout import PipelineKey, pipelines
from meshnet.tracker.collect import StageTls, sample_stage


async def idle_pipelines(pods: Sequence[ObservedPod], grpc_port: int,
                         timeout: float = 2.0,
                         tls: StageTls | None = None) -> frozenset[PipelineKey]:
    """The draining pipelines whose every stage pod answered that it holds no session
    (asked over mTLS with `tls`, the operator's identity at the route)."""
    draining = [g for g in pipelines(pods).values() if g.draining_since is not None]
    if not draining:
        return frozenset()
    asked = [p for g in draining for p in g.pods if p.ip]
    answers = await asyncio.gather(*(sample_stage(f"{p.ip}:{grpc_port}", timeout, tls)
                                     for p in asked))
    idle = {p.name for p, a in zip(asked, answers, strict=True)
            if a.capacity is not None and a.capacity.active_sessions == 0}
    return frozenset((g.replica, g.epoch) for g in draining
                     if all(p.name in idle for p in g.pods))
