"""ModelArtifact status from what its provisioning Job reported (pure, no I/O).

The operator observes the Job's phase and the `meshnet artifact pull --json` summary
of its latest finished attempt, and calls `artifact_status()`; status is rebuilt from
those observations every time, never from the previous status (only condition
transition times are carried over while a condition keeps its status).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

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
    previous: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    value = "True" if status else "False"
    since = _timestamp(now)
    for old in previous:
        if old.get("type") == kind and old.get("status") == value and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


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


def artifact_status(
    summary: Mapping[str, Any] | None,
    job_phase: JobPhase,
    *,
    manifest_digest: str,
    generation: int,
    now: datetime,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The ModelArtifact `status` for one provisioning Job.

    `summary` is the parsed JSON of `meshnet artifact pull --json` (None while no
    attempt has finished); one made for another manifest is stale and ignored.
    `manifest_digest` is the current spec's; `previous_conditions` only lends
    lastTransitionTime to conditions whose status did not change.
    """
    if summary is not None and summary.get("manifestDigest") != manifest_digest:
        summary = None
    status: dict[str, Any] = {"observedGeneration": generation, "manifestDigest": manifest_digest}
    if summary is not None:
        status["progress"] = {
            key: int(summary.get(key, 0))
            for key in ("filesVerified", "filesTotal", "bytesVerified", "bytesTotal")
        }
        facts = summary.get("gguf")
        if isinstance(facts, Mapping):
            status["gguf"] = {key: facts[key] for key in _FACT_KEYS if key in facts}
    status["conditions"] = [
        _condition(kind, value, reason, message, generation, now, previous_conditions)
        for kind, value, reason, message in _conditions(summary, job_phase)
    ]
    return status
