"""Pure planning for ShardRoutes: observed state + spec -> plan (actions, events, status).

Nothing in this package performs I/O; `meshnet.operator` observes and executes.
"""

from meshnet.reconcile.observed import (
    Observed,
    ObservedArtifact,
    ObservedPod,
    ObservedRoute,
    observe_artifact,
    observe_pod,
    observe_route,
)
from meshnet.reconcile.planner import Action, Create, Delete, Event, Patch, Plan, next_epoch, plan
from meshnet.reconcile.podspec import WorkerConfig, headless_service, stage_pod, worker_args
from meshnet.reconcile.workerspec import Identities, WorkerSpec

__all__ = [
    "Action",
    "Create",
    "Delete",
    "Event",
    "Identities",
    "Observed",
    "ObservedArtifact",
    "ObservedPod",
    "ObservedRoute",
    "Patch",
    "Plan",
    "WorkerConfig",
    "WorkerSpec",
    "headless_service",
    "next_epoch",
    "observe_artifact",
    "observe_pod",
    "observe_route",
    "plan",
    "stage_pod",
    "worker_args",
]
