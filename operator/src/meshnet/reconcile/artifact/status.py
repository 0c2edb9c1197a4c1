"""ModelArtifact status from what its provisioning Job reported (pure planning, no I/O).

The operator observes the Job's phase and the `meshnet artifact pull --json` summary
of its latest finished attempt, and calls `artifact_status()` (and `node_copy()` per
node for host-path storage); status is rebuilt from those observations every time,
never from the previous status (only condition transition times are carried over
while a condition keeps its status).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from meshnet.api.common import Condition
from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.modelartifact import (
    ArtifactProgress,
    GgufDrafter,
    GgufFacts,
    ModelArtifactSpec,
    ModelArtifactStatus,
    NodeCopy,
    human_size,
)
from meshnet.errors import (
    ArtifactSpecError,
    DownloadFailed,
    DrafterMismatch,
    ExpectationMismatch,
    HashMismatch,
    IncompleteSplitSet,
    StorageRefused,
)
from meshnet.reconcile.conditions import Verdict, stamp

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
    DrafterMismatch.reason,
}
_FACT_KEYS = (
    "architecture",
    "blockCount",
    "layers",
    "embeddingLength",
    "boundary",
    "bytesPerLayer",
)


def _verdicts(
    summary: Mapping[str, Any] | None, job_phase: JobPhase
) -> list[Verdict]:
    """Ready, Progressing and Failed for one Job's latest report."""
    if summary is None:
        if job_phase == "Failed":
            reason, message = DownloadFailed.reason, "the provisioning Job failed without a summary"
            return [
                Verdict(READY, False, reason, message),
                Verdict(PROGRESSING, False, reason, message),
                Verdict(FAILED, True, reason, message),
            ]
        message = (
            "the provisioning Job finished; waiting for its summary"
            if job_phase == "Succeeded"
            else f"the provisioning Job is {job_phase.lower()}"
        )
        return [
            Verdict(READY, False, PROVISIONING, message),
            Verdict(PROGRESSING, True, PROVISIONING, message),
            Verdict(FAILED, False, PROVISIONING, message),
        ]
    message = str(summary.get("message", ""))
    result = str(summary.get("result", ""))
    if result == VERIFIED:
        return [
            Verdict(READY, True, VERIFIED, message),
            Verdict(PROGRESSING, False, VERIFIED, message),
            Verdict(FAILED, False, VERIFIED, message),
        ]
    reason = result if result in FAILURE_REASONS else DownloadFailed.reason
    if reason in RETRYABLE_REASONS and job_phase != "Failed":
        retry = f"retrying after {reason}: {message}"
        return [
            Verdict(READY, False, reason, message),
            Verdict(PROGRESSING, True, RETRYING, retry),
            Verdict(FAILED, False, reason, message),
        ]
    return [
        Verdict(READY, False, reason, message),
        Verdict(PROGRESSING, False, reason, message),
        Verdict(FAILED, True, reason, message),
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
        drafter=_drafter(facts.get("drafter")),
    )


def _drafter(facts: object) -> GgufDrafter | None:
    if not isinstance(facts, Mapping):
        return None
    kind = DrafterKind.from_api(facts.get("kind"))
    if kind is None:
        return None
    return GgufDrafter(kind=kind.api_name, target_layers=list(facts.get("targetLayers", [])),
                       vocab_size=facts.get("vocabSize", 0),
                       tensor_bytes=facts.get("tensorBytes", 0), file=facts.get("file"))


def _current(summary: Mapping[str, Any] | None, digest: str) -> Mapping[str, Any] | None:
    """The summary if it was made for this manifest; one for an older spec is stale."""
    return summary if summary is not None and summary.get("manifestDigest") == digest else None


def artifact_status(
    spec: ModelArtifactSpec,
    summary: Mapping[str, Any] | None,
    job_phase: JobPhase,
    *,
    generation: int | None,
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
        conditions=stamp(_verdicts(summary, job_phase), previous_conditions, generation, now),
    )


def node_copy(
    node: str, spec: ModelArtifactSpec, summary: Mapping[str, Any] | None, job_phase: JobPhase
) -> NodeCopy:
    """One node's host-path copy (one provisioning Job per node) for `status.nodes`."""
    summary = _current(summary, spec.manifest_digest())
    ready = next(v for v in _verdicts(summary, job_phase) if v.type == READY)
    verified, reason, message = ready.status, ready.reason, ready.message
    return NodeCopy(
        node=node, verified=verified, message="" if verified else f"{reason}: {message}"
    )
