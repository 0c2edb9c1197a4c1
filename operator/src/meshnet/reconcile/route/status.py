"""Status derived from what was observed (never from the previous status, except the
epoch bookkeeping and the transition times of conditions that did not change)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from meshnet.api.shardroute import ShardRouteSpec
from meshnet.reconcile.conditions import Verdict, as_status, stamp
from meshnet.reconcile.naming import endpoint
from meshnet.reconcile.route.observed import ObservedPod

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
OWN_CONDITIONS = (READY, PROGRESSING, DEGRADED)
Verdicts = tuple[Verdict, Verdict, Verdict]  # Ready, Progressing, Degraded
NOT_FAILING = Verdict(DEGRADED, False, "AsExpected", "no stage is failing")


def invalid(message: str) -> Verdicts:
    return (Verdict(READY, False, "InvalidSpec", message),
            Verdict(PROGRESSING, False, "InvalidSpec", message),
            Verdict(DEGRADED, True, "InvalidSpec", message))


def waiting_for_artifact(message: str) -> Verdicts:
    return (Verdict(READY, False, "ArtifactNotReady", message),
            Verdict(PROGRESSING, True, "ArtifactNotReady", message), NOT_FAILING)


def from_stages(spec: ShardRouteSpec, current: Mapping[str, ObservedPod], rolling: bool,
                epoch: int) -> Verdicts:
    """Ready when every stage pod of this epoch is ready; Degraded names failing stages."""
    names = [s.name for s in spec.stages]
    missing = [n for n in names if not (n in current and current[n].ready)]
    failing = [f"stage {n} (pod {p.name}) is {p.failing_reason}: {p.failing_message}".rstrip(": ")
               for n in names if (p := current.get(n)) and p.failing_reason]
    crash = any(current[n].failing_reason == "CrashLoopBackOff"
                for n in names if n in current and current[n].failing_reason)
    degraded = (Verdict(DEGRADED, True, "StageCrashLooping" if crash else "StageFailing",
                        "; ".join(failing)) if failing else NOT_FAILING)
    count = f"{len(names) - len(missing)}/{len(names)} stages ready at epoch {epoch}"
    if not missing:
        return (Verdict(READY, True, "AllStagesReady", count),
                Verdict(PROGRESSING, False, "RolloutComplete", f"epoch {epoch} is live"),
                degraded)
    unschedulable = [f"stage {n}: {current[n].unschedulable}" for n in missing
                     if n in current and current[n].unschedulable]
    why = "; ".join(unschedulable) or f"waiting for {', '.join(missing)}"
    reason = ("EpochRollout" if rolling else
              "StageUnschedulable" if unschedulable else "StagesStarting")
    return (Verdict(READY, False, "StagesNotReady", f"{count}: {why}"),
            Verdict(PROGRESSING, True, reason, why), degraded)


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
                  route: str, namespace: str, port: int) -> list[dict[str, Any]]:
    entries = []
    for stage in layout:
        entry: dict[str, Any] = {"name": stage.name,
                                 "layers": {"begin": stage.begin, "end": stage.end},
                                 "ready": False, "restarts": 0}
        pod = current.get(stage.name)
        if pod is not None:
            entry.update(pod=pod.name, epoch=pod.epoch, ready=pod.ready and not pod.terminating,
                         endpoint=endpoint(stage.name, route, namespace, port),
                         restarts=pod.restarts, incarnation=f"{pod.uid[:8]}-{pod.restarts}")
        entries.append(entry)
    return entries


def coverage(layout: Sequence[StageLayers], block_count: int | None) -> str:
    """'0-30/30': the layers this route serves out of the model's block count."""
    first, last = layout[0].begin, layout[-1].end
    return f"{first}-{last}/{block_count if block_count is not None else '?'}"
