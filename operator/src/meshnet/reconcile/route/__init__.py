"""Planning for ShardRoutes: `plan(observed, config, now)` and what it is built from."""

from meshnet.reconcile.route.observed import (
    Observed,
    ObservedPod,
    ObservedRoute,
    ReferencedArtifact,
    gateway_rolled_out,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    replica_of,
)
from meshnet.reconcile.route.planner import STATUS_KEYS, next_epoch, plan, spec_problems
from meshnet.reconcile.route.podspec import WorkerConfig, headless_service, stage_pod, worker_args
from meshnet.reconcile.route.workerspec import Identities, WorkerSpec

__all__ = [
    "STATUS_KEYS",
    "Identities",
    "Observed",
    "ObservedPod",
    "ObservedRoute",
    "ReferencedArtifact",
    "WorkerConfig",
    "WorkerSpec",
    "gateway_rolled_out",
    "headless_service",
    "next_epoch",
    "observe_pod",
    "observe_referenced_artifact",
    "observe_route",
    "plan",
    "replica_of",
    "spec_problems",
    "stage_pod",
    "worker_args",
]
