"""`meshnet artifact manifest`: hash a split-GGUF set and describe it as a ModelArtifact."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from meshnet.artifacts.drafter import describe_drafter
from meshnet.artifacts.facts import ModelFacts, artifact_facts
from meshnet.artifacts.gguf_header import read_header
from meshnet.artifacts.hashing import sha256_file
from meshnet.artifacts.spec import API_VERSION, DIGEST_ANNOTATION, KIND
from meshnet.artifacts.splitset import check_split_names, parse_split_name
from meshnet.artifacts.verify import MeterFactory
from meshnet.digests import manifest_digest
from meshnet.errors import ArtifactSpecError, IncompleteSplitSet


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...]
    facts: ModelFacts

    @property
    def model_file(self) -> str:
        """The first file of the model itself (not its drafter)."""
        drafter = self.facts.drafter.file if self.facts.drafter else None
        return next(e.name for e in self.entries if e.name != drafter)

    @property
    def digest(self) -> str:
        return manifest_digest((e.name, e.size, e.sha256) for e in self.entries)


def collect_files(paths: Sequence[Path]) -> list[Path]:
    """Files named directly, plus the *.gguf files of any folder named; one per file name."""
    found: dict[str, Path] = {}
    for path in paths:
        if path.is_dir():
            members = sorted(path.glob("*.gguf"))
            if not members:
                raise IncompleteSplitSet(f"{path} holds no .gguf file")
        elif path.is_file():
            members = [path]
        else:
            raise ArtifactSpecError(f"{path}: no such file or folder")
        for member in members:
            if member.name in found and found[member.name].resolve() != member.resolve():
                raise ArtifactSpecError(
                    f"two files named {member.name}: {found[member.name]}, {member}"
                )
            found[member.name] = member
    return [found[name] for name in sorted(found)]


def build_manifest(paths: Sequence[Path], meters: MeterFactory) -> Manifest:
    """Check the set is one complete model and at most one drafter that fits it (headers
    first, cheap), then hash every file."""
    files = collect_files(paths)
    check_split_names([f.name for f in files])
    headers = [read_header(f) for f in files]
    facts = artifact_facts(headers)
    entries = []
    with meters(sum(f.stat().st_size for f in files), "hash") as meter:
        for file in files:
            meter.describe(file.name)
            entries.append(ManifestEntry(file.name, file.stat().st_size, sha256_file(file, meter)))
    return Manifest(tuple(entries), facts)


def default_name(file_name: str) -> str:
    """A Kubernetes name from the model's file name: lower case, dashes, at most 63."""
    split = parse_split_name(file_name)
    stem = split.prefix if split else file_name.removesuffix(".gguf")
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:63].rstrip("-")
    return name or "model"


def artifact_document(manifest: Manifest, name: str, base_url: str | None = None) -> dict[str, Any]:
    drafter = manifest.facts.drafter.file if manifest.facts.drafter else None
    spec: dict[str, Any] = {
        "files": [{"name": e.name, "size": e.size, "sha256": e.sha256}
                  | ({"role": "Drafter"} if e.name == drafter else {})
                  for e in manifest.entries],
    }
    if base_url:
        spec["source"] = {"http": {"baseURL": base_url}}
    spec["expectations"] = {
        "architecture": manifest.facts.architecture,
        "blockCount": manifest.facts.block_count,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "annotations": {DIGEST_ANNOTATION: manifest.digest}},
        "spec": spec,
    }


def render_document(document: dict[str, Any], manifest: Manifest) -> str:
    facts = manifest.facts
    header = (
        f"# {len(manifest.entries)} file(s), {sum(e.size for e in manifest.entries):,} bytes; "
        f"manifestDigest {manifest.digest}\n"
        f"# {facts.architecture}, {facts.block_count} blocks, embedding length "
        f"{facts.embedding_length}\n"
        + (f"# drafter: {describe_drafter(facts.drafter)}\n" if facts.drafter else "")
        + "# Add spec.source (if not given) and spec.storage (a PVC or a host path,\n"
        "# never under /home) before applying it.\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False)
