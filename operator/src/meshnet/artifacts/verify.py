"""Verify a folder against a ModelArtifact manifest and read the model's GGUF facts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshnet.api.modelartifact import ArtifactExpectations, ArtifactManifest
from meshnet.artifacts.facts import ModelFacts, artifact_facts
from meshnet.artifacts.gguf_header import read_header
from meshnet.artifacts.hashing import sha256_file
from meshnet.artifacts.markers import Layout, check_file_names, has_valid_marker, write_marker
from meshnet.artifacts.progress import Meter
from meshnet.artifacts.spec import Artifact
from meshnet.artifacts.splitset import check_split_names
from meshnet.errors import DrafterMismatch, ExpectationMismatch, HashMismatch, IncompleteSplitSet

MeterFactory = Callable[[int, str], AbstractContextManager[Meter]]


def check_expectations(facts: ModelFacts, expected: ArtifactExpectations) -> None:
    if expected.architecture and expected.architecture != facts.architecture:
        raise ExpectationMismatch(
            f"the GGUF architecture is {facts.architecture}, "
            f"spec.expectations.architecture says {expected.architecture}"
        )
    if expected.block_count and expected.block_count != facts.block_count:
        raise ExpectationMismatch(
            f"the GGUF block count is {facts.block_count}, "
            f"spec.expectations.blockCount says {expected.block_count}"
        )


def read_model_facts(
    folder: Path, names: Sequence[str], expected: ArtifactExpectations
) -> ModelFacts:
    """GGUF facts of the model (and drafter) in `folder` made of the GGUF files among
    `names`."""
    headers = [read_header(folder / name) for name in names if name.endswith(".gguf")]
    if not headers:
        raise IncompleteSplitSet("the manifest lists no .gguf file")
    facts = artifact_facts(headers)
    check_expectations(facts, expected)
    return facts


def check_drafter_role(facts: ModelFacts, declared: str | None) -> None:
    """DrafterMismatch unless the file of role Drafter is the one whose header is a DSpark
    drafter: a route loads the file its role names, so a wrong role must not verify."""
    found = facts.drafter.file if facts.drafter else None
    if declared == found:
        return
    if declared is None:
        raise DrafterMismatch(f"{found} is a DSpark drafter GGUF (architecture dflash):"
                              " give it role Drafter")
    raise DrafterMismatch(f"{declared} has role Drafter but is not a DSpark drafter GGUF"
                          + (f" ({found} is)" if found else ""))


@dataclass(frozen=True)
class FileCheck:
    name: str
    size: int
    how: str  # "marker": a matching verified marker; "hashed": read and hashed now


@dataclass(frozen=True)
class VerifyReport:
    artifact: str
    manifest_digest: str
    files: tuple[FileCheck, ...]
    facts: ModelFacts

    def to_json(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "manifestDigest": self.manifest_digest,
            "files": [{"name": f.name, "size": f.size, "verifiedBy": f.how} for f in self.files],
            "bytesVerified": sum(f.size for f in self.files),
            "gguf": self.facts.to_json(),
        }


def verify_folder(
    folder: Path, artifact: Artifact[ArtifactManifest], meters: MeterFactory, full: bool = False
) -> VerifyReport:
    """Hash every manifest file not already covered by a matching marker (all with `full`).

    Markers are written as files pass, so an interrupted verify resumes at the file it
    stopped in; a read-only folder (a stage's mount) is verified without markers. A marker
    vouches only while size and mtime match: `full` re-hashes regardless.
    """
    spec = artifact.spec
    layout = Layout(folder)
    check_file_names(f.name for f in spec.files)
    check_split_names([f.name for f in spec.files])
    missing = [f.name for f in spec.files if not layout.final(f.name).is_file()]
    if missing:
        raise IncompleteSplitSet(f"missing from {folder}: {', '.join(missing)}")
    trusted = set() if full else {f.name for f in spec.files if has_valid_marker(layout, f)}
    to_hash = [f for f in spec.files if f.name not in trusted]
    checks: list[FileCheck] = []
    mismatches: list[HashMismatch] = []
    with meters(sum(f.size for f in to_hash), "verify") as meter:
        for file in spec.files:
            if file.name in trusted:
                checks.append(FileCheck(file.name, file.size, "marker"))
                continue
            meter.describe(file.name)
            path = layout.final(file.name)
            actual = sha256_file(path, meter)
            size = path.stat().st_size
            if actual != file.sha256 or size != file.size:
                note = (
                    f" ({size:,} bytes, manifest says {file.size:,})" if size != file.size else ""
                )
                mismatches.append(HashMismatch(file.name, file.sha256, actual + note))
                with suppress(OSError):  # a read-only mount keeps its markers
                    layout.marker(file.name).unlink(missing_ok=True)
                continue
            write_marker(layout, file)
            checks.append(FileCheck(file.name, file.size, "hashed"))
    if mismatches:
        first = mismatches[0]
        if len(mismatches) > 1:
            others = ", ".join(m.name for m in mismatches[1:])
            first.args = (f"{first.args[0]} (also mismatched: {others})",)
        raise first
    facts = read_model_facts(folder, [f.name for f in spec.files], spec.expectations)
    check_drafter_role(facts, spec.drafter_file())
    return VerifyReport(artifact.name, spec.manifest_digest(), tuple(checks), facts)
