"""Status derived from what was observed (never from the previous status, except the
epoch bookkeeping and the transition times of conditions that did not change)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.api.shardroute import ShardRouteSpec
from meshnet.reconcile.naming import endpoint
from meshnet.reconcile.observed import ObservedPod


@dataclass(frozen=True)
class Verdict:
    """The three conditions as (status, reason, message)."""

    ready: tuple[str, str, str]
    progressing: tuple[str, str, str]
    degraded: tuple[str, str, str]


def invalid(message: str) -> Verdict:
    return Verdict(("False", "InvalidSpec", message), ("False", "InvalidSpec", message),
                   ("True", "InvalidSpec", message))


def waiting_for_artifact(message: str) -> Verdict:
    return Verdict(("False", "ArtifactNotReady", message), ("True", "ArtifactNotReady", message),
                   ("False", "AsExpected", "no stage is failing"))


def from_stages(spec: ShardRouteSpec, current: Mapping[str, ObservedPod], rolling: bool,
                epoch: int) -> Verdict:
    """Ready when every stage pod of this epoch is ready; Degraded names failing stages."""
    names = [s.name for s in spec.stages]
    missing = [n for n in names if not (n in current and current[n].ready)]
    failing = [f"stage {n} (pod {p.name}) is {p.failing_reason}: {p.failing_message}".rstrip(": ")
               for n in names if (p := current.get(n)) and p.failing_reason]
    crash = any(current[n].failing_reason == "CrashLoopBackOff"
                for n in names if n in current and current[n].failing_reason)
    degraded = (("True", "StageCrashLooping" if crash else "StageFailing", "; ".join(failing))
                if failing else ("False", "AsExpected", "no stage is failing"))
    count = f"{len(names) - len(missing)}/{len(names)} stages ready at epoch {epoch}"
    if not missing:
        return Verdict(("True", "AllStagesReady", count),
                       ("False", "RolloutComplete", f"epoch {epoch} is live"), degraded)
    unschedulable = [f"stage {n}: {current[n].unschedulable}" for n in missing
                     if n in current and current[n].unschedulable]
    why = "; ".join(unschedulable) or f"waiting for {', '.join(missing)}"
    reason = ("EpochRollout" if rolling else
              "StageUnschedulable" if unschedulable else "StagesStarting")
    return Verdict(("False", "StagesNotReady", f"{count}: {why}"), ("True", reason, why), degraded)


OWN_CONDITIONS = ("Ready", "Progressing", "Degraded")


def conditions(verdict: Verdict, previous: Sequence[Mapping[str, Any]], generation: int | None,
               now: str) -> list[dict[str, Any]]:
    """Our conditions in a fixed order; lastTransitionTime moves only when status flips."""
    before = {c.get("type"): c for c in previous}
    out = []
    verdicts = (verdict.ready, verdict.progressing, verdict.degraded)
    for kind, (status, reason, message) in zip(OWN_CONDITIONS, verdicts, strict=True):
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        condition: dict[str, Any] = {"type": kind, "status": status, "reason": reason,
                                     "message": message, "lastTransitionTime": since or now}
        if generation is not None:
            condition["observedGeneration"] = generation
        out.append(condition)
    # Conditions of other writers (e.g. Certified) are theirs: carried over untouched.
    return out + [dict(c) for c in previous if c.get("type") not in OWN_CONDITIONS]


def stage_entries(spec: ShardRouteSpec, current: Mapping[str, ObservedPod], route: str,
                  namespace: str, port: int) -> list[dict[str, Any]]:
    entries = []
    for stage in spec.stages:
        entry: dict[str, Any] = {"name": stage.name,
                                 "layers": {"begin": stage.layers.begin, "end": stage.layers.end},
                                 "ready": False, "restarts": 0}
        pod = current.get(stage.name)
        if pod is not None:
            entry.update(pod=pod.name, epoch=pod.epoch, ready=pod.ready and not pod.terminating,
                         endpoint=endpoint(stage.name, route, namespace, port),
                         restarts=pod.restarts, incarnation=f"{pod.uid[:8]}-{pod.restarts}")
        entries.append(entry)
    return entries


def coverage(spec: ShardRouteSpec, block_count: int | None) -> str:
    """'0-30/30': the layers this route serves out of the model's block count."""
    first, last = spec.stages[0].layers.begin, spec.stages[-1].layers.end
    return f"{first}-{last}/{block_count if block_count is not None else '?'}"
