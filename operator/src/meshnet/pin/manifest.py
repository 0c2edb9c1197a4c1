"""The `llama-pin.yaml` manifest: one upstream commit, its sources and our patch stack."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from meshnet.errors import PinError

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
GitSha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Upstream(_Strict):
    repository: str
    commit: GitSha
    tree: GitSha


class GitSource(_Strict):
    kind: Literal["git"]
    repository: str


class SdistSource(_Strict):
    kind: Literal["pypi-sdist"]
    package: str
    version: str
    sha256: Sha256
    subdirectory: str


Source = Annotated[GitSource | SdistSource, Field(discriminator="kind")]


class PatchEntry(_Strict):
    name: Annotated[str, Field(pattern=r"^\d{4}-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")]
    sha256: Sha256


class DebianPackage(_Strict):
    """A Debian package a lane's build reads (e.g. newer headers): fetched from `suite`
    through a private package list, verified, unpacked into the cache, never installed."""

    package: str
    version: str
    suite: str
    sha256: Sha256


class PinManifest(_Strict):
    upstream: Upstream
    sources: list[Source]
    # By lane: build inputs beyond the tree. Not in digest(): they enter that lane's build
    # key only (pin/build.py), so other lanes' builds stay cached.
    lane_packages: dict[str, list[DebianPackage]] = {}
    # By lane: the software device its workers run on where the host has no GPU
    # (pin/software_device.py). Runtime only: in no build key.
    device_packages: dict[str, list[DebianPackage]] = {}
    patches: list[PatchEntry] = []

    def digest(self) -> str:
        """The pin's part of the recipe identity: commit, tree and patch stack digests."""
        canonical = {
            "commit": self.upstream.commit,
            "tree": self.upstream.tree,
            "patches": [p.sha256 for p in self.patches],
        }
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def load_manifest(path: Path) -> PinManifest:
    """Read and validate `llama-pin.yaml`, naming the file in any error."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PinError(f"cannot read {path}: {exc}") from exc
    try:
        return PinManifest.model_validate(raw)
    except ValueError as exc:
        raise PinError(f"{path} is not a valid pin manifest:\n{exc}") from exc


def write_patch_list(path: Path, patches: list[PatchEntry]) -> None:
    """Rewrite only the `patches:` section (last in the file), keeping the comments above."""
    text = path.read_text()
    head, sep, _ = text.partition("\npatches:")
    if not sep:
        raise PinError(f"{path} has no top-level 'patches:' section")
    body = yaml.safe_dump(
        [p.model_dump() for p in patches], sort_keys=False, default_flow_style=False
    )
    section = "\npatches:\n" + "".join(f"  {line}\n" for line in body.splitlines())
    path.write_text(head + (section if patches else "\npatches: []\n"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
