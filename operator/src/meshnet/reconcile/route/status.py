"""Status derived from what was observed (never from the previous status, except the
epoch bookkeeping and the transition times of conditions that did not change)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from meshnet.api import labels
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.reconcile.conditions import Verdict, as_status, stamp
from meshnet.reconcile.naming import endpoint
from meshnet.reconcile.route.observed import Observed, ObservedPod

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
OWN_CONDITIONS = (READY, PROGRESSING, DEGRADED)
Verdicts = tuple[Verdict, Verdict, Verdict]  # Ready, Progressing, Degraded
PodKey = tuple[int, str]  # (replica, stage)
NOT_FAILING = Verdict(DEGRADED, False, "AsExpected", "no stage is failing")


def invalid(message: str, reason: str = "InvalidSpec") -> Verdicts:
    return (Verdict(READY, False, reason, message),
            Verdict(PROGRESSING, False, reason, message),
            Verdict(DEGRADED, True, reason, message))


def waiting_for_artifact(message: str) -> Verdicts:
    return (Verdict(READY, False, "ArtifactNotReady", message),
            Verdict(PROGRESSING, True, "ArtifactNotReady", message), NOT_FAILING)


def scaled_to_zero(epoch: int) -> Verdicts:
    """spec.replicas 0: nothing serves, and nothing is wrong (not Degraded, not stuck)."""
    message = f"spec.replicas is 0: no stage pods run at epoch {epoch}; scale up to serve"
    return (Verdict(READY, False, "ScaledToZero", message),
            Verdict(PROGRESSING, False, "ScaledToZero", message), NOT_FAILING)


def from_stages(spec: ShardRouteSpec, current: Mapping[PodKey, ObservedPod], rolling: bool,
                epoch: int) -> Verdicts:
    """Ready while at least one replica has every stage pod of the pipeline serving it
    ready (it can serve: mid-rollout, the old epoch's counts until the new one takes over);
    AllStagesReady once every replica is ready at this epoch. Degraded names failing
    stages."""
    if spec.replicas == 0:
        return scaled_to_zero(epoch)
    names, replicas = [s.name for s in spec.stages], range(spec.replicas)
    missing = {r: [n for n in names if not ((r, n) in current and current[r, n].ready)]
               for r in replicas}
    pods = [(r, n, current[r, n]) for r in replicas for n in names if (r, n) in current]
    failing = [f"stage {n} (pod {p.name}) is {p.failing_reason}: {p.failing_message}".rstrip(": ")
               for _, n, p in pods if p.failing_reason]
    crash = any(p.failing_reason == "CrashLoopBackOff" for _, _, p in pods)
    degraded = (Verdict(DEGRADED, True, "StageCrashLooping" if crash else "StageFailing",
                        "; ".join(failing)) if failing else NOT_FAILING)
    ready = [r for r in replicas if not missing[r]]
    old = sorted({p.epoch for _, _, p in pods if p.epoch != epoch})
    if spec.replicas == 1 and not old:
        count = f"{len(names) - len(missing[0])}/{len(names)} stages ready at epoch {epoch}"
    else:
        updated = [r for r in ready if all(p.epoch == epoch for q, _, p in pods if q == r)]
        count = (f"{len(ready)}/{spec.replicas} replicas ready, {len(updated)} at epoch"
                 f" {epoch}" if old else f"{len(ready)}/{spec.replicas} replicas ready at"
                                         f" epoch {epoch}")
    if len(ready) == spec.replicas and not rolling:
        return (Verdict(READY, True, "AllStagesReady", count),
                Verdict(PROGRESSING, False, "RolloutComplete", f"epoch {epoch} is live"),
                degraded)

    def of(replica: int) -> str:
        return "" if spec.replicas == 1 else f" of replica {replica}"

    unschedulable = [f"stage {n}{of(r)}: {p.unschedulable}" for r, n, p in pods
                     if p.unschedulable and n in missing[r]]
    why = "; ".join(unschedulable) or "; ".join(
        f"waiting for {', '.join(missing[r])}{of(r)}" for r in replicas if missing[r])
    if rolling:
        why = "; ".join(filter(None, [f"rolling out epoch {epoch} replica by replica"
                                      + (f" (epoch {', '.join(map(str, old))} serves the"
                                         " others meanwhile)" if old else ""), why]))
    reason = ("EpochRollout" if rolling else
              "StageUnschedulable" if unschedulable else "StagesStarting")
    serving = (Verdict(READY, True, "EpochRollout" if rolling and len(ready) == spec.replicas
                       else "SomeReplicasReady", f"{count}: {why}") if ready else
               Verdict(READY, False, "StagesNotReady", f"{count}: {why}"))
    return serving, Verdict(PROGRESSING, True, reason, why), degraded


def conditions(verdicts: Verdicts, previous: Sequence[Mapping[str, Any]],
               generation: int | None, now: datetime) -> list[dict[str, Any]]:
    """Our conditions in a fixed order, then other writers' (e.g. Certified) untouched."""
    ours = as_status(stamp(verdicts, previous, generation, now))
    return ours + [dict(c) for c in previous if c.get("type") not in OWN_CONDITIONS]


@dataclass(frozen=True)
class StageLayers:
    """A stage's name and layer range, as a spec (or the status of the last valid one) says."""

    name: str
    begin: int
    end: int


def layout_of(spec: ShardRouteSpec) -> tuple[StageLayers, ...]:
    return tuple(StageLayers(s.name, s.layers.begin, s.layers.end) for s in spec.stages)


def recorded_layout(status: Mapping[str, Any]) -> tuple[StageLayers, ...]:
    """The stages status.stages recorded: those of the last valid spec, which its pods
    keep serving while the spec is invalid."""
    layout = []
    for entry in status.get("stages") or []:
        layers = entry.get("layers") or {}
        if isinstance(entry.get("name"), str) and all(
                isinstance(layers.get(k), int) for k in ("begin", "end")):
            layout.append(StageLayers(entry["name"], layers["begin"], layers["end"]))
    return tuple(layout)


def stage_entries(layout: Sequence[StageLayers], current: Mapping[str, ObservedPod],
                  route: str, namespace: str, port: int, replica: int = 0) -> list[dict[str, Any]]:
    """One replica's stages: `current` holds the pods of the pipeline serving it by stage
    name."""
    entries = []
    for stage in layout:
        entry: dict[str, Any] = {"name": stage.name,
                                 "layers": {"begin": stage.begin, "end": stage.end},
                                 "ready": False, "restarts": 0}
        pod = current.get(stage.name)
        if pod is not None:
            entry.update(pod=pod.name, epoch=pod.epoch, ready=pod.ready and not pod.terminating,
                         endpoint=endpoint(stage.name, route, namespace, port, replica,
                                           pod.epoch),
                         restarts=pod.restarts, incarnation=f"{pod.uid[:8]}-{pod.restarts}")
        entries.append(entry)
    return entries


def coverage(layout: Sequence[StageLayers], block_count: int | None) -> str:
    """'0-30/30': the layers this route serves out of the model's block count."""
    first, last = layout[0].begin, layout[-1].end
    return f"{first}-{last}/{block_count if block_count is not None else '?'}"


@dataclass(frozen=True)
class Served:
    """What status.stages and its neighbours describe: a layout and its pods at the epoch."""

    layout: tuple[StageLayers, ...]
    current: Mapping[PodKey, ObservedPod]
    replicas: int  # the replicas to describe
    session_slots: int  # per ready replica
    endpoint: str | None  # the gateway's URL, None without one
    draining: tuple[str, ...] = ()  # pipelines draining, e.g. e1/r0


def served_status(status: dict[str, Any], observed: Observed, served: Served,
                  port: int) -> None:
    """The stage tables of every replica, and the counts the scale subresource and
    `kubectl get` show; status.stages is replica 0's table (the spec's stages, without
    pods, while there is no replica)."""
    route = observed.route
    tables = [stage_entries(served.layout,
                                   {s: p for (r, s), p in served.current.items() if r == replica},
                                   route.name, route.namespace, port, replica)
              for replica in range(served.replicas)]
    ready = [sum(1 for s in table if s["ready"]) for table in tables]
    ready_replicas = sum(1 for n in ready if n == len(served.layout))
    epochs = [epoch_of(table) for table in tables]
    updated = sum(1 for n, e in zip(ready, epochs, strict=True)
                  if n == len(served.layout) and e == status.get("epoch"))
    total = len(served.layout) * served.replicas
    block_count = observed.artifact.block_count if observed.artifact else None
    status.update(
        replicas=len({p.replica for p in observed.pods if not p.terminating}),
        readyReplicas=ready_replicas,
        updatedReplicas=updated,
        selector=f"{labels.ROUTE}={route.name}",
        stages=tables[0] if tables else stage_entries(
            served.layout, {}, route.name, route.namespace, port),
        replicaStatuses=[{"replica": r, "ready": n == len(served.layout),
                          "stagesReady": f"{n}/{len(served.layout)}", "stages": table}
                         | ({"epoch": e} if e is not None else {})
                         for r, (table, n, e) in enumerate(zip(tables, ready, epochs,
                                                               strict=True))],
        stagesReady=f"{sum(ready)}/{total}",
        coverage=coverage(served.layout, block_count),
        capacity={"readyStages": sum(ready), "totalStages": total,
                  "sessionSlots": served.session_slots * ready_replicas},
    )
    if served.draining:
        status["draining"] = list(served.draining)


def epoch_of(table: Sequence[Mapping[str, Any]]) -> int | None:
    """The epoch of the pipeline a replica's stage table shows (None: no pod yet)."""
    return next((s["epoch"] for s in table if "epoch" in s), None)
