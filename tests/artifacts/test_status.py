"""ModelArtifact status derived from a pull's --json summary and the Job's phase."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.reconcile.artifact.status import artifact_status, node_copy

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SPEC = ModelArtifactSpec.model_validate({
    "files": [
        {"name": "m-00001-of-00002.gguf", "size": 1000, "sha256": "a" * 64},
        {"name": "m-00002-of-00002.gguf", "size": 500, "sha256": "b" * 64},
    ],
    "source": {"http": {"baseURL": "https://models.example/m"}},
    "storage": {"pvc": {"claimName": "models"}},
})
DIGEST = SPEC.manifest_digest()


def summary(result: str = "Verified", retryable: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "ArtifactPullSummary", "manifestDigest": DIGEST, "result": result,
        "message": "details", "retryable": retryable, "filesVerified": 1, "filesTotal": 2,
        "bytesVerified": 1000, "bytesTotal": 1500, **extra,
    }


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_a_verified_pull_makes_the_artifact_ready_with_its_gguf_facts():
    facts = {"architecture": "llama", "blockCount": 30, "layers": 30, "embeddingLength": 576,
             "boundary": {"schema": "DENSE_RESIDUAL", "shape": [576], "tokenIds": False}}
    done = summary(filesVerified=2, bytesVerified=1500, gguf=facts)

    status = artifact_status(SPEC, done, "Succeeded", generation=3, now=T0)

    assert conditions(status) == {"Ready": ("True", "Verified"),
                                  "Progressing": ("False", "Verified"),
                                  "Failed": ("False", "Verified")}
    assert status.manifest_digest == DIGEST and status.short_digest == DIGEST[:12]
    assert status.progress is not None and status.progress.bytes_verified == 1500
    assert status.gguf is not None
    assert (status.gguf.architecture, status.gguf.block_count, status.gguf.embedding_length) == (
        "llama", 30, 576)
    assert status.gguf.layers == 30  # what a route's stages must cover
    assert (status.gguf.boundary_schema, status.gguf.boundary_shape) == ("DENSE_RESIDUAL", [576])
    assert {c.observed_generation for c in status.conditions} == {3}
    wire = status.model_dump(by_alias=True, exclude_none=True)
    assert wire["progress"]["filesVerified"] == 2 and wire["observedGeneration"] == 3


def test_a_running_job_without_a_summary_is_progressing():
    status = artifact_status(SPEC, None, "Running", generation=1, now=T0)

    assert conditions(status) == {"Ready": ("False", "Provisioning"),
                                  "Progressing": ("True", "Provisioning"),
                                  "Failed": ("False", "Provisioning")}
    assert status.progress is not None
    assert (status.progress.files_total, status.progress.bytes_total) == (2, 1500)
    assert status.gguf is None


@pytest.mark.parametrize("reason", ["DownloadFailed", "HashMismatch"])
def test_a_retryable_failure_keeps_progressing_while_the_job_retries(reason):
    status = artifact_status(SPEC, summary(reason, retryable=True), "Running", generation=1, now=T0)

    assert conditions(status) == {"Ready": ("False", reason), "Progressing": ("True", "Retrying"),
                                  "Failed": ("False", reason)}


@pytest.mark.parametrize("reason", ["DownloadFailed", "HashMismatch"])
def test_a_retryable_failure_fails_the_artifact_once_the_job_gives_up(reason):
    status = artifact_status(SPEC, summary(reason, retryable=True), "Failed", generation=1, now=T0)

    assert conditions(status)["Failed"] == ("True", reason)
    assert conditions(status)["Progressing"] == ("False", reason)


@pytest.mark.parametrize("reason", ["IncompleteSplitSet", "StorageRefused", "InvalidSpec",
                                    "ExpectationMismatch"])
def test_a_spec_or_storage_problem_fails_at_once_even_while_the_job_runs(reason):
    status = artifact_status(SPEC, summary(reason), "Running", generation=1, now=T0)

    assert conditions(status) == {"Ready": ("False", reason), "Progressing": ("False", reason),
                                  "Failed": ("True", reason)}
    assert next(c for c in status.conditions if c.type == "Failed").message == "details"


def test_a_failed_job_without_a_summary_is_a_download_failure():
    status = artifact_status(SPEC, None, "Failed", generation=1, now=T0)

    assert conditions(status)["Failed"] == ("True", "DownloadFailed")


def test_a_summary_for_another_manifest_is_ignored_as_stale():
    stale = summary(manifestDigest="0" * 64)

    status = artifact_status(SPEC, stale, "Running", generation=2, now=T0)

    assert conditions(status)["Ready"] == ("False", "Provisioning")
    assert status.progress is not None and status.progress.files_verified == 0


def test_an_unknown_result_is_reported_as_a_download_failure():
    status = artifact_status(SPEC, summary("Exploded"), "Failed", generation=1, now=T0)

    assert conditions(status)["Failed"] == ("True", "DownloadFailed")


def test_transition_times_change_only_when_a_condition_changes_status():
    first = artifact_status(SPEC, None, "Running", generation=1, now=T0)
    later = T0 + timedelta(minutes=5)

    second = artifact_status(SPEC, summary(filesVerified=2), "Succeeded", generation=1, now=later,
                             previous_conditions=first.conditions)

    times = {c.type: c.last_transition_time for c in second.conditions}
    assert times["Ready"] == times["Progressing"] == "2026-11-01T12:05:00Z"
    assert times["Failed"] == "2026-11-01T12:00:00Z"  # False before and after


def test_a_node_copy_is_verified_only_after_a_verified_pull():
    assert node_copy("gpu-1", SPEC, summary(), "Succeeded").verified
    pending = node_copy("gpu-2", SPEC, None, "Running")
    assert not pending.verified and pending.message.startswith("Provisioning")
