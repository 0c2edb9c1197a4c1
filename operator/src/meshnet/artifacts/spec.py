"""Load a ModelArtifact resource (meshnet.api) from YAML, with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from meshnet.api.common import API_VERSION
from meshnet.api.modelartifact import KIND, ArtifactFile, ModelArtifact, ModelArtifactSpec
from meshnet.errors import ArtifactSpecError

__all__ = [
    "API_VERSION",
    "DIGEST_ANNOTATION",
    "KIND",
    "Artifact",
    "ArtifactFile",
    "load_artifact",
    "parse_artifact",
]

# Written by `meshnet artifact manifest`; where present it must match spec.files.
DIGEST_ANNOTATION = "meshnet.dev/manifest-digest"


@dataclass(frozen=True)
class Artifact:
    """A validated ModelArtifact: its name and spec (status is the operator's business)."""

    name: str
    spec: ModelArtifactSpec


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_artifact(document: Any, origin: str = "artifact") -> Artifact:
    if not isinstance(document, dict):
        raise ArtifactSpecError(f"{origin}: expected a {KIND} mapping")
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise ArtifactSpecError(
            f"{origin}: expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {document.get('apiVersion')} {document.get('kind')}"
        )
    try:
        resource = ModelArtifact.model_validate(
            {k: v for k, v in document.items() if k != "status"}
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ArtifactSpecError(f"{origin}: {problems}") from None
    metadata = _mapping(document.get("metadata"))
    pinned = _mapping(metadata.get("annotations")).get(DIGEST_ANNOTATION)
    computed = resource.spec.manifest_digest()
    if pinned and pinned != computed:
        raise ArtifactSpecError(
            f"{origin}: spec.files hash to manifestDigest {computed}, but the "
            f"{DIGEST_ANNOTATION} annotation says {pinned}"
        )
    return Artifact(str(metadata.get("name") or ""), resource.spec)


def load_artifact(path: Path) -> Artifact:
    """The first ModelArtifact document of a YAML file."""
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except OSError as exc:
        raise ArtifactSpecError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ArtifactSpecError(f"{path} is not valid YAML: {exc}") from None
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return parse_artifact(document, str(path))
    raise ArtifactSpecError(f"{path} holds no {KIND} document")
