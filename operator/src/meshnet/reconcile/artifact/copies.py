"""The status of a host-path ModelArtifact, held as one copy per selected node (pure).

Each node's provisioning Job is judged alone by `artifact_status`/`node_copy`; the
artifact is then Ready once at least one node holds a verified copy (stage pods are
only scheduled onto nodes labelled with a verified copy, so a route can start there
while other nodes are still copying), Progressing while any copy is being provisioned
or retried, and Failed while any copy has failed for good (the message names the node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from meshnet.api.common import Condition
from meshnet.api.modelartifact import ModelArtifactSpec, ModelArtifactStatus
from meshnet.errors import StorageRefused
from meshnet.reconcile.artifact.status import (
    FAILED,
    PROGRESSING,
    READY,
    VERIFIED,
    JobPhase,
    artifact_status,
    node_copy,
)
from meshnet.reconcile.conditions import Verdict, stamp


@dataclass(frozen=True)
class Copy:
    """One node's copy: what its Job reported (None: nothing yet) and the Job's phase."""

    node: str
    summary: Mapping[str, Any] | None
    phase: JobPhase


def _condition(status: ModelArtifactStatus, kind: str) -> Condition:
    return next(c for c in status.conditions if c.type == kind)


def copies_status(spec: ModelArtifactSpec, copies: Sequence[Copy], *, generation: int | None,
                  now: datetime, previous_conditions: Sequence[Condition] = ()
                  ) -> ModelArtifactStatus:
    """Ready / Progressing / Failed over every selected node's copy, plus `nodes`."""
    if not copies:
        selector = spec.storage.host_path.node_selector if spec.storage.host_path else {}
        why = f"no node matches storage.hostPath.nodeSelector {dict(selector)}"
        base = artifact_status(spec, None, "Pending", generation=generation, now=now)
        verdicts: list[Verdict] = [Verdict(READY, False, StorageRefused.reason, why),
                                   Verdict(PROGRESSING, False, StorageRefused.reason, why),
                                   Verdict(FAILED, True, StorageRefused.reason, why)]
        return base.model_copy(update={
            "conditions": stamp(verdicts, previous_conditions, generation, now)})
    ordered = sorted(copies, key=lambda c: c.node)
    each = {c.node: artifact_status(spec, c.summary, c.phase, generation=generation, now=now)
            for c in ordered}

    def holds(kind: str) -> list[str]:
        return [node for node, status in each.items()
                if _condition(status, kind).status == "True"]

    def detail(nodes: Sequence[str], kind: str) -> str:
        return "; ".join(f"{node}: {_condition(each[node], kind).message}" for node in nodes)

    verified, moving, failing = holds(READY), holds(PROGRESSING), holds(FAILED)
    progress = {n: (s.progress.bytes_verified if s.progress else 0) for n, s in each.items()}
    lead = (verified or failing or [max(each, key=lambda n: progress[n])])[0]
    count = f"{len(verified)}/{len(each)} nodes"
    ready: Verdict = (
        Verdict(READY, True, VERIFIED, f"verified on {count} ({', '.join(verified)})")
        if verified else
        Verdict(READY, False, _condition(each[lead], READY).reason, detail(list(each), READY))
    )
    progressing: Verdict = (
        Verdict(PROGRESSING, True, _condition(each[moving[0]], PROGRESSING).reason,
         detail(moving, PROGRESSING))
        if moving else
        Verdict(PROGRESSING, False, _condition(each[lead], PROGRESSING).reason,
         f"no copy is being provisioned; verified on {count}")
    )
    failed: Verdict = (
        Verdict(FAILED, True, _condition(each[failing[0]], FAILED).reason, detail(failing, FAILED))
        if failing else
        Verdict(FAILED, False, _condition(each[lead], FAILED).reason, "no copy has failed")
    )
    return each[lead].model_copy(update={
        "nodes": [node_copy(c.node, spec, c.summary, c.phase) for c in ordered],
        "conditions": stamp([ready, progressing, failed], previous_conditions, generation, now),
    })
