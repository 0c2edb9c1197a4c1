"""How a cluster route's pipelines change without taking the route down (pure).

A pipeline is the stage pods of one replica at one epoch; pods carry both in their names
and addresses, so a new epoch's pipeline of a replica starts beside the old one and
epochs never mix inside a pipeline. Replica by replica, within spec.rollout's budgets
(maxSurge pipelines beyond spec.replicas, maxUnavailable replicas without a ready one):

1. the new epoch's pipeline of a replica is created beside the old one (surge), or once
   the old one has gone when no surge is left;
2. when it is ready the gateway switches the replica to it and the old one drains: it
   takes no new sessions (it leaves the gateway's replicas), its running sessions finish,
   and it is deleted as soon as its stages hold no session once the gateway has rolled
   (`drained`, observed), else drainSeconds after (the annotation on its pods says since
   when);
3. a pipeline of a replica past spec.replicas drains the same way (scaling down).

The gateway lists, per replica, the pipeline that serves it (`serving`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from meshnet.api import labels
from meshnet.api.shardroute import Rollout
from meshnet.reconcile.plan import Action, Delete, Event, Patch
from meshnet.reconcile.route.observed import ObservedPod
from meshnet.timestamps import parse_rfc3339, rfc3339

PipelineKey = tuple[int, int]  # (replica, epoch)
# How often a draining pipeline's sessions are looked at (the reconcile comes back):
# nothing else says when they end.
DRAIN_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class Pipeline:
    """The live stage pods of one replica at one epoch."""

    replica: int
    epoch: int
    pods: tuple[ObservedPod, ...]

    @property
    def name(self) -> str:
        return f"e{self.epoch}/r{self.replica}"

    @property
    def draining_since(self) -> datetime | None:
        """When it stopped taking new sessions (its earliest mark); None while it serves."""
        marks = [t for p in self.pods if p.draining_since
                 and (t := parse_rfc3339(p.draining_since)) is not None]
        return min(marks, default=None)

    def ready(self, stages: Sequence[str]) -> bool:
        """Every stage has a ready pod: the pipeline can serve a session."""
        up = {p.stage for p in self.pods if p.ready}
        return all(s in up for s in stages)


@dataclass
class RolloutPlan:
    """What the rollout does this reconcile, and what serves each replica meanwhile."""

    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    serving: dict[int, int] = field(default_factory=dict)  # replica -> epoch it is served by
    draining: list[str] = field(default_factory=list)  # pipelines draining, e.g. e1/r0
    creatable: set[int] = field(default_factory=set)  # replicas whose missing pods to create
    requeue_after: float | None = None  # seconds until the next drain ends


def pipelines(pods: Sequence[ObservedPod]) -> dict[PipelineKey, Pipeline]:
    """The live (not terminating) pods grouped by replica and epoch."""
    groups: dict[PipelineKey, list[ObservedPod]] = {}
    for pod in pods:
        if not pod.terminating:
            groups.setdefault((pod.replica, pod.epoch), []).append(pod)
    return {key: Pipeline(*key, tuple(group)) for key, group in sorted(groups.items())}


def roll(pods: Sequence[ObservedPod], stages: Sequence[str], epoch: int, replicas: int,
         rollout: Rollout, now: datetime,
         drained: Collection[PipelineKey] = frozenset()) -> RolloutPlan:
    """Which pipelines to start (their replicas in `creatable`), drain and delete, so that
    every replica ends at `epoch` and no replica past `replicas` is left. `drained`: the
    draining pipelines known to hold no session and to get none (deleted at once)."""
    return _Roll(pipelines(pods), stages, epoch, replicas, rollout, now, drained).plan()


def in_place(pods: Sequence[ObservedPod], stages: Sequence[str], epoch: int,
             serving: Mapping[int, int], outdated: set[int], max_unavailable: int) -> set[int]:
    """Of the replicas with a pod of `epoch` to replace in place (its template changed or
    it ended: same name, so nothing can start beside it), those whose pods go now: any
    that is not serving at `epoch` or is down already, and of the serving ones as many as
    maxUnavailable allows (at least one: an in-place change has no other way), never the
    last serving one while another replica could take its turn."""
    groups = pipelines(pods)
    up = {r for r, e in serving.items()
          if (group := groups.get((r, e))) is not None and group.ready(stages)}
    allowed = set()
    for replica in sorted(outdated):
        if serving.get(replica) != epoch or replica not in up:
            allowed.add(replica)
        elif len(serving) - len(up) < max(1, max_unavailable) \
                and (len(up) > 1 or len(serving) == 1):
            allowed.add(replica)
            up.discard(replica)
    return allowed


class _Roll:
    """One rollout decision, replica by replica, keeping count of what it changed."""

    def __init__(self, groups: dict[PipelineKey, Pipeline], stages: Sequence[str], epoch: int,
                 replicas: int, rollout: Rollout, now: datetime,
                 drained: Collection[PipelineKey] = frozenset()) -> None:
        self.groups, self.stages, self.epoch = groups, stages, epoch
        self.replicas, self.rollout, self.now = replicas, rollout, now
        self.drained = drained
        self.result = RolloutPlan()
        self.marked = {k for k, g in groups.items() if g.draining_since is not None}
        self.gone: set[PipelineKey] = set()  # deleted by this plan
        self.running = len(groups)  # pipelines, surge included, after this plan

    def plan(self) -> RolloutPlan:
        drain = timedelta(seconds=self.rollout.drain_seconds)
        for key, group in self.groups.items():
            since = group.draining_since
            if since is not None and key in self.drained:
                self._delete(group, "its sessions ended")
            elif since is not None and self.now - since >= drain:
                self._delete(group, f"its {self.rollout.drain_seconds}s drain ended")
        for (replica, epoch), group in self.groups.items():  # scaled away
            if replica >= self.replicas and (replica, epoch) not in self.marked:
                self._retire(group, f"replica {replica} is past spec.replicas {self.replicas}")
        for replica in range(self.replicas):
            self._replica(replica)
        left = sorted(self.marked - self.gone)
        self.result.draining = [self.groups[k].name for k in left]
        ends = [(self.groups[k].draining_since or self.now) + drain - self.now for k in left]
        if ends:  # back when the first drain ends, or sooner to see whether its sessions did
            self.result.requeue_after = min(max(0.0, min(ends).total_seconds()) + 0.5,
                                            DRAIN_POLL_SECONDS)
        return self.result

    def _replica(self, replica: int) -> None:
        epoch, surge = self.epoch, self.rollout.max_surge
        new = self.groups.get((replica, epoch))
        olds = [g for (r, e), g in self.groups.items()
                if r == replica and e != epoch and (r, e) not in self.marked]
        # The old pipeline the gateway keeps until the new one is ready: the newest ready
        # one (else the newest). Older ones never served once it did, and go at once.
        keep = max(olds, key=lambda g: (g.ready(self.stages), g.epoch), default=None)
        for other in olds:
            if other is not keep:
                assert keep is not None
                self._delete(other, f"epoch {keep.epoch} serves replica {replica}")
        serving = self.result.serving
        if keep is None:
            serving[replica] = epoch
            draining = any(r == replica for r, _ in self.marked - self.gone)
            if new is not None or not draining or self.running < self.replicas + surge:
                self._create(replica, new)
            return
        if new is not None and new.ready(self.stages):
            serving[replica] = epoch
            self._retire(keep, f"epoch {epoch} of replica {replica} is ready")
            return
        serving[replica] = keep.epoch
        if new is not None or self.running < self.replicas + surge:
            self._create(replica, new)
        elif self._may_take_down(keep):
            serving[replica] = epoch
            self._retire(keep, f"epoch {epoch} replaces it and no surge is left (maxSurge"
                               f" {surge})")
            if self.running < self.replicas + surge:  # deleted at once (no drain)
                self._create(replica, None)

    def _serving_now(self) -> list[int]:
        """Replicas below spec.replicas that a ready, undrained pipeline serves."""
        live = [g for k, g in self.groups.items() if k not in self.marked
                and k not in self.gone and g.ready(self.stages)]
        return sorted({g.replica for g in live if g.replica < self.replicas})

    def _may_take_down(self, keep: Pipeline) -> bool:
        """Whether `keep` may drain before its replacement exists: within maxUnavailable,
        and never the last replica serving unless maxSurge is 0 (then there is no other
        way)."""
        serving = self._serving_now()
        down = self.replicas - len(serving) + int(keep.replica in serving)
        last = serving == [keep.replica]
        return down <= self.rollout.max_unavailable and (not last or self.rollout.max_surge == 0)

    def _create(self, replica: int, existing: Pipeline | None) -> None:
        self.result.creatable.add(replica)
        self.running += existing is None

    def _retire(self, group: Pipeline, why: str) -> None:
        """No new sessions for `group`: the gateway drops it now, it goes once drained."""
        self.marked.add((group.replica, group.epoch))
        if self.rollout.drain_seconds == 0:
            self._delete(group, why)
            return
        stamp = {labels.DRAINING_ANNOTATION: rfc3339(self.now)}
        for pod in group.pods:
            self.result.actions.append(Patch("Pod", pod.name,
                                             {"metadata": {"annotations": stamp}}))
        self.result.events.append(Event(
            "Normal", "PipelineDraining", f"pipeline {group.name} takes no new sessions:"
            f" {why}; it is deleted in {self.rollout.drain_seconds}s"))

    def _delete(self, group: Pipeline, why: str) -> None:
        key = (group.replica, group.epoch)
        if key in self.gone:
            return
        self.gone.add(key)
        self.running -= 1
        self.result.actions += [Delete("Pod", p.name) for p in group.pods]
        removed = group.replica >= self.replicas
        names = ", ".join(p.name for p in group.pods)
        self.result.events.append(Event(
            "Normal", "ReplicaRemoved" if removed else "StagePodReplaced",
            f"deleted pipeline {group.name} (pod{'s' * (len(group.pods) > 1)} {names}): {why}"))
