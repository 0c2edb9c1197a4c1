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

__all__ = [
    "Action",
    "Create",
    "Delete",
    "Event",
    "Observed",
    "ObservedArtifact",
    "ObservedPod",
    "ObservedRoute",
    "Patch",
    "Plan",
    "WorkerConfig",
    "headless_service",
    "next_epoch",
    "observe_artifact",
    "observe_pod",
    "observe_route",
    "plan",
    "stage_pod",
    "worker_args",
]
