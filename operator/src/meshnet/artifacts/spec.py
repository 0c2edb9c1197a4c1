"""Load a ModelArtifact resource (meshnet.api) from YAML, with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import Field, ValidationError

from meshnet.api.common import API_VERSION
from meshnet.api.modelartifact import (
    KIND,
    ArtifactFile,
    ArtifactManifest,
    ArtifactSource,
    ArtifactStorage,
    ModelArtifactSpec,
)
from meshnet.errors import ArtifactSpecError

__all__ = [
    "API_VERSION",
    "DIGEST_ANNOTATION",
    "KIND",
    "Artifact",
    "ArtifactFile",
    "CommandLineSpec",
    "load_artifact",
    "parse_artifact",
]

# Written by `meshnet artifact manifest`; where present it must match spec.files.
DIGEST_ANNOTATION = "meshnet.dev/manifest-digest"


SpecT = TypeVar("SpecT", bound=ArtifactManifest, covariant=True)


@dataclass(frozen=True)
class Artifact(Generic[SpecT]):
    """A validated ModelArtifact: its name and spec (status is the operator's business)."""

    name: str
    spec: SpecT


class CommandLineSpec(ArtifactManifest):
    """A ModelArtifact spec as `meshnet artifact pull/verify` read it: the command line says
    where the files go (--dest) and may say where they come from (--source-dir), so source
    and storage may be left out, as `meshnet artifact manifest` leaves them."""

    source: ArtifactSource | None = Field(default=None)
    storage: ArtifactStorage | None = Field(default=None)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_artifact(document: Any, origin: str = "artifact") -> Artifact[ModelArtifactSpec]:
    """A complete ModelArtifact resource, as the cluster would take it."""
    return _parse(document, origin, ModelArtifactSpec)


S = TypeVar("S", bound=ArtifactManifest)


def _parse(document: Any, origin: str, model: type[S]) -> Artifact[S]:
    if not isinstance(document, dict):
        raise ArtifactSpecError(f"{origin}: expected a {KIND} mapping")
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise ArtifactSpecError(
            f"{origin}: expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {document.get('apiVersion')} {document.get('kind')}"
        )
    try:
        spec = model.model_validate(document.get("spec"))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(('spec', *map(str, err['loc'])))}: {err['msg']}" for err in exc.errors()
        )
        raise ArtifactSpecError(f"{origin}: {problems}") from None
    metadata = _mapping(document.get("metadata"))
    pinned = _mapping(metadata.get("annotations")).get(DIGEST_ANNOTATION)
    computed = spec.manifest_digest()
    if pinned and pinned != computed:
        raise ArtifactSpecError(
            f"{origin}: spec.files hash to manifestDigest {computed}, but the "
            f"{DIGEST_ANNOTATION} annotation says {pinned}"
        )
    return Artifact(str(metadata.get("name") or ""), spec)


def load_artifact(path: Path) -> Artifact[CommandLineSpec]:
    """The first ModelArtifact document of a YAML file, source and storage optional."""
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except OSError as exc:
        raise ArtifactSpecError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ArtifactSpecError(f"{path} is not valid YAML: {exc}") from None
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return _parse(document, str(path), CommandLineSpec)
    raise ArtifactSpecError(f"{path} holds no {KIND} document")
