"""What the artifact planner sees: compact, typed views of a ModelArtifact, its
provisioning Jobs (with the summary their pods reported) and the cluster's nodes,
parsed from raw Kubernetes objects by pure functions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshnet.api import labels
from meshnet.api.modelartifact import PULL_SUMMARY_KIND, ModelArtifactSpec
from meshnet.reconcile.artifact.status import JobPhase
from meshnet.reconcile.resource import ObservedResource, observe_resource

ObservedArtifact = ObservedResource[ModelArtifactSpec]


@dataclass(frozen=True)
class ObservedJob:
    """One provisioning Job (or full re-hash Job: `rehash` is its round), with the pull
    summary of its latest finished attempt and when that attempt ended."""

    name: str
    artifact: str
    spec_hash: str
    manifest_digest: str
    node: str | None = None
    phase: JobPhase = "Pending"
    summary: Mapping[str, Any] | None = None
    finished_at: str = ""
    rehash: str = ""


@dataclass(frozen=True)
class Attempt:
    """One finished run of the pull container: when it ended and what it reported."""

    finished_at: str
    summary: Mapping[str, Any]


@dataclass(frozen=True)
class ObservedNode:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of one ModelArtifact is based on. `claims`: per manifest
    digest, the nodes where another ModelArtifact's copy of the same bytes is complete
    (the node label is by content, so theirs must not be taken away)."""

    artifact: ObservedArtifact
    jobs: tuple[ObservedJob, ...] = ()
    config_maps: tuple[str, ...] = ()
    nodes: tuple[ObservedNode, ...] = ()
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)


def observe_artifact(body: Mapping[str, Any]) -> ObservedArtifact:
    return observe_resource(body, ModelArtifactSpec)


def job_phase(status: Mapping[str, Any]) -> JobPhase:
    """The Job's phase from its conditions (Complete/Failed, or their early targets)."""
    true = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    if true & {"Complete", "SuccessCriteriaMet"}:
        return "Succeeded"
    if true & {"Failed", "FailureTarget"}:
        return "Failed"
    return "Running" if int(status.get("active") or 0) > 0 else "Pending"


def observe_job(body: Mapping[str, Any]) -> ObservedJob | None:
    """None for Jobs that are not provisioning Jobs of an artifact."""
    meta = body.get("metadata") or {}
    notes = meta.get("annotations") or {}
    tags = meta.get("labels") or {}
    if labels.ARTIFACT_ANNOTATION not in notes or labels.ARTIFACT not in tags:
        return None
    return ObservedJob(
        name=meta.get("name", ""), artifact=notes[labels.ARTIFACT_ANNOTATION],
        spec_hash=tags.get(labels.TEMPLATE, ""),
        manifest_digest=notes.get(labels.MANIFEST_ANNOTATION, ""),
        node=notes.get(labels.NODE_ANNOTATION) or None,
        phase=job_phase(body.get("status") or {}),
        rehash=notes.get(labels.REHASH_ANNOTATION, ""),
    )


def _summary(message: str) -> Mapping[str, Any] | None:
    """A termination message that is a pull summary, else None (e.g. a crash's empty one)."""
    try:
        parsed = json.loads(message)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("kind") == PULL_SUMMARY_KIND else None


def observe_attempts(pod: Mapping[str, Any]) -> tuple[Attempt, ...]:
    """Finished runs of a Job pod's containers that reported a summary: the current state
    (a finished pod) and the last one (a container restarted by restartPolicy OnFailure)."""
    attempts = []
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (container.get("state"), container.get("lastState")):
            ended = (state or {}).get("terminated") or {}
            summary = _summary(str(ended.get("message") or ""))
            if summary is not None:
                attempts.append(Attempt(str(ended.get("finishedAt") or ""), summary))
    return tuple(attempts)


def latest_attempt(attempts: Iterable[Attempt]) -> Attempt | None:
    """The attempt that finished last (RFC 3339 times sort as text)."""
    found = sorted(attempts, key=lambda a: a.finished_at)
    return found[-1] if found else None


def with_attempts(job: ObservedJob, attempts: Iterable[Attempt]) -> ObservedJob:
    """The Job with the summary and end time of its latest finished attempt."""
    latest = latest_attempt(attempts)
    if latest is None:
        return job
    return replace(job, summary=latest.summary, finished_at=latest.finished_at)


def observe_node(body: Mapping[str, Any]) -> ObservedNode:
    meta = body.get("metadata") or {}
    return ObservedNode(meta.get("name", ""), dict(meta.get("labels") or {}))
