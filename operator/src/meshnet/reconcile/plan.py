"""The one shape of a reconcile's outcome, for every resource we own (pure): the steps
to take in order, the events to post, and the new status."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshnet.reconcile.route.workerspec import WorkerSpec


@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]
    worker: WorkerSpec | None = None  # a stage pod's worker, typed (the pod has it rendered)


@dataclass(frozen=True)
class Patch:
    kind: str
    name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


Action = Create | Patch | Delete


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Step:
    """One action, and the event that announces it once it took effect (a create that
    found the object already there announces nothing)."""

    action: Action
    event: Event | None = None


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()
    events: tuple[Event, ...] = ()  # posted after the steps
    status: dict[str, Any] | None = None  # the whole new status; None when unchanged
    epoch_advanced: bool = False  # a route's epoch went up (a metric)
    conditions: Mapping[str, str] = field(default_factory=dict)  # type -> status, for metrics
    # The condition types `status` stamps: its writer's. Other writers' are kept as the
    # object has them when the status is written, not as the plan's read had them.
    own_conditions: tuple[str, ...] = ()
    # Reconcile again in this many seconds even if nothing changes (a drain that ends).
    requeue_after: float | None = None

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(step.action for step in self.steps)


def steps(actions: Sequence[Action]) -> tuple[Step, ...]:
    """Steps of actions no event announces one by one."""
    return tuple(Step(action) for action in actions)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any],
                keys: Sequence[str]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` for `keys`: what `new` lacks is removed
    (null), nested objects are diffed (a merge patch would otherwise keep their old
    fields), lists are replaced whole."""
    patch: dict[str, Any] = {}
    for key in keys:
        before, after = old.get(key), new.get(key)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            inner = merge_patch(before, after, sorted(set(before) | set(after)))
            if inner:
                patch[key] = inner
        elif before != after:
            patch[key] = after
    return patch
