"""ModelArtifact status from what its provisioning Job reported (pure planning, no I/O).

The operator observes the Job's phase and the `meshnet artifact pull --json` summary
of its latest finished attempt, and calls `artifact_status()` (and `node_copy()` per
node for host-path storage); status is rebuilt from those observations every time,
never from the previous status (only condition transition times are carried over
while a condition keeps its status).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from meshnet.api.common import Condition
from meshnet.api.modelartifact import (
    ArtifactProgress,
    GgufFacts,
    ModelArtifactSpec,
    ModelArtifactStatus,
    NodeCopy,
    human_size,
)
from meshnet.errors import (
    ArtifactSpecError,
    DownloadFailed,
    ExpectationMismatch,
    HashMismatch,
    IncompleteSplitSet,
    StorageRefused,
)

JobPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
READY, PROGRESSING, FAILED = "Ready", "Progressing", "Failed"
VERIFIED = "Verified"
PROVISIONING = "Provisioning"
RETRYING = "Retrying"
# Retrying the Job can cure these; the others need a change of spec or storage.
RETRYABLE_REASONS = {DownloadFailed.reason, HashMismatch.reason}
FAILURE_REASONS = RETRYABLE_REASONS | {
    IncompleteSplitSet.reason,
    StorageRefused.reason,
    ArtifactSpecError.reason,
    ExpectationMismatch.reason,
}
_FACT_KEYS = (
    "architecture",
    "blockCount",
    "layers",
    "embeddingLength",
    "boundary",
    "bytesPerLayer",
)


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    kind: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
    previous: Sequence[Condition],
) -> Condition:
    value: Literal["True", "False"] = "True" if status else "False"
    since = _timestamp(now)
    for old in previous:
        if old.type == kind and old.status == value and old.last_transition_time:
            since = old.last_transition_time
    return Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )


def _conditions(
    summary: Mapping[str, Any] | None, job_phase: JobPhase
) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) for Ready, Progressing and Failed."""
    if summary is None:
        if job_phase == "Failed":
            reason, message = DownloadFailed.reason, "the provisioning Job failed without a summary"
            return [
                (READY, False, reason, message),
                (PROGRESSING, False, reason, message),
                (FAILED, True, reason, message),
            ]
        message = (
            "the provisioning Job finished; waiting for its summary"
            if job_phase == "Succeeded"
            else f"the provisioning Job is {job_phase.lower()}"
        )
        return [
            (READY, False, PROVISIONING, message),
            (PROGRESSING, True, PROVISIONING, message),
            (FAILED, False, PROVISIONING, message),
        ]
    message = str(summary.get("message", ""))
    result = str(summary.get("result", ""))
    if result == VERIFIED:
        return [
            (READY, True, VERIFIED, message),
            (PROGRESSING, False, VERIFIED, message),
            (FAILED, False, VERIFIED, message),
        ]
    reason = result if result in FAILURE_REASONS else DownloadFailed.reason
    if reason in RETRYABLE_REASONS and job_phase != "Failed":
        retry = f"retrying after {reason}: {message}"
        return [
            (READY, False, reason, message),
            (PROGRESSING, True, RETRYING, retry),
            (FAILED, False, reason, message),
        ]
    return [
        (READY, False, reason, message),
        (PROGRESSING, False, reason, message),
        (FAILED, True, reason, message),
    ]


def gguf_facts(summary: Mapping[str, Any]) -> GgufFacts | None:
    """The GGUF facts a pull/verify summary recorded, as the status shows them."""
    facts = summary.get("gguf")
    if not isinstance(facts, Mapping):
        return None
    boundary = facts.get("boundary")
    if not isinstance(boundary, Mapping):
        boundary = {}
    return GgufFacts(
        architecture=facts.get("architecture"),
        block_count=facts.get("blockCount"),
        layers=facts.get("layers"),
        embedding_length=facts.get("embeddingLength"),
        boundary_schema=boundary.get("schema"),
        boundary_shape=list(boundary.get("shape", [])),
        hash_layer_count=int(boundary.get("hashLayers", 0)) or None,
    )


def _current(summary: Mapping[str, Any] | None, digest: str) -> Mapping[str, Any] | None:
    """The summary if it was made for this manifest; one for an older spec is stale."""
    return summary if summary is not None and summary.get("manifestDigest") == digest else None


def artifact_status(
    spec: ModelArtifactSpec,
    summary: Mapping[str, Any] | None,
    job_phase: JobPhase,
    *,
    generation: int,
    now: datetime,
    previous_conditions: Sequence[Condition] = (),
) -> ModelArtifactStatus:
    """The ModelArtifact status for one provisioning Job.

    `summary` is the parsed JSON of `meshnet artifact pull --json` from the Job's latest
    finished attempt (None while none has finished); one made for another manifest is
    ignored. `previous_conditions` only lends lastTransitionTime to conditions whose
    status did not change. Conditions: Ready, Progressing, Failed; failure reasons
    DownloadFailed, HashMismatch, IncompleteSplitSet, StorageRefused (and InvalidSpec,
    ExpectationMismatch for a spec the headers contradict).
    """
    digest = spec.manifest_digest()
    summary = _current(summary, digest)
    progress = ArtifactProgress(files_total=len(spec.files), bytes_total=spec.total_bytes())
    if summary is not None:
        progress = ArtifactProgress(
            files_verified=int(summary.get("filesVerified", 0)),
            files_total=len(spec.files),
            bytes_verified=int(summary.get("bytesVerified", 0)),
            bytes_total=spec.total_bytes(),
        )
    return ModelArtifactStatus(
        observed_generation=generation,
        manifest_digest=digest,
        short_digest=digest[:12],
        size=human_size(spec.total_bytes()),
        progress=progress,
        gguf=gguf_facts(summary) if summary is not None else None,
        conditions=[
            _condition(kind, value, reason, message, generation, now, previous_conditions)
            for kind, value, reason, message in _conditions(summary, job_phase)
        ],
    )


def node_copy(
    node: str, spec: ModelArtifactSpec, summary: Mapping[str, Any] | None, job_phase: JobPhase
) -> NodeCopy:
    """One node's host-path copy (one provisioning Job per node) for `status.nodes`."""
    summary = _current(summary, spec.manifest_digest())
    conditions = {
        kind: (value, reason, message)
        for kind, value, reason, message in _conditions(summary, job_phase)
    }
    verified, reason, message = conditions[READY]
    return NodeCopy(
        node=node, verified=verified, message="" if verified else f"{reason}: {message}"
    )
