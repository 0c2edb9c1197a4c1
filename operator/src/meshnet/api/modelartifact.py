"""The ModelArtifact resource: an exact split-GGUF model with a hashed manifest,
provisioned onto node storage and verified (docs/architecture.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshnet.api.common import (
    CONDITIONS_LIST,
    MAX_FILES,
    MAX_NAME,
    MAX_PATH,
    ApiModel,
    Condition,
    StatusModel,
    no_home,
    rule,
    validations,
)
from meshnet.api.drafter_kind import DrafterApiName
from meshnet.digests import manifest_digest

KIND = "ModelArtifact"
PLURAL = "modelartifacts"
FileRole = Literal["Model", "Drafter"]
# The `kind` of the JSON summary `meshnet artifact pull --json` writes as its
# termination message, which the operator reads back.
PULL_SUMMARY_KIND = "ArtifactPullSummary"


class ArtifactFile(ApiModel):
    """One file of the model, identified by its exact size and sha256."""

    name: str = Field(
        min_length=1, max_length=253,
        description="File name inside the artifact directory (no path separators).",
        json_schema_extra=validations(rule(
            "!self.contains('/') && !self.contains('\\\\') && self != '.' && self != '..'",
            "file names must not contain path separators",
        )),
    )
    size: int = Field(ge=0, description="Exact size in bytes.")
    sha256: str = Field(
        min_length=64, max_length=64, description="Lower-case hex sha256 of the file's bytes.",
        json_schema_extra=validations(rule(
            "self.matches('^[0-9a-f]{64}$')", "sha256 must be 64 lower-case hex digits",
        )),
    )
    url: str | None = Field(
        default=None, max_length=2048,
        description="Where to download this file; defaults to source.http.baseURL + name.",
    )
    role: FileRole | None = Field(
        default=None,
        description="Model (the default): a file of the model (a split of its GGUF set)."
                    " Drafter: a DSpark"
                    " drafter GGUF (architecture dflash) for the model, loaded only by the last"
                    " stage of a route whose recipe.speculation.mode is DSpark. Checked"
                    " against the file's header when the artifact is verified; not part of"
                    " the manifest digest (the file's bytes are).",
    )


class HttpSource(ApiModel):
    """Download files over HTTP(S), resuming with range requests."""

    base_url: str = Field(
        alias="baseURL", min_length=1, max_length=2048,
        description="URL prefix; each file is fetched from baseURL + '/' + name.",
    )


class PvcLocation(ApiModel):
    """A directory on a PersistentVolumeClaim in the artifact's namespace."""

    claim_name: str = Field(min_length=1, max_length=253, description="Name of the PVC.")
    sub_path: str = Field(
        default="", max_length=MAX_PATH, description="Directory inside the volume ('' = root).",
    )


class HostPathLocation(ApiModel, json_schema_extra=validations(no_home())):
    """A directory on the node's filesystem (never under /home)."""

    path: str = Field(min_length=1, max_length=MAX_PATH, description="Absolute host directory.")


_EXACTLY_ONE = "exactly one of {fields} must be set"


class ArtifactSource(
    ApiModel,
    json_schema_extra=validations(rule(
        "[has(self.http), has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1",
        _EXACTLY_ONE.format(fields="http, pvc, hostPath"),
    )),
):
    """Where the verified files come from."""

    http: HttpSource | None = Field(default=None, description="Download over HTTP(S).")
    pvc: PvcLocation | None = Field(default=None, description="Copy from an existing PVC.")
    host_path: HostPathLocation | None = Field(default=None, description="Copy from a host path.")


class HostPathStorage(HostPathLocation):
    """A host directory on every node that may run a stage (one copy per node)."""

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Nodes that receive a copy (one provisioning Job per matching node).",
    )


class ArtifactStorage(
    ApiModel,
    json_schema_extra=validations(rule(
        "[has(self.pvc), has(self.hostPath)].filter(x, x).size() == 1",
        _EXACTLY_ONE.format(fields="pvc, hostPath"),
    )),
):
    """Where the verified files live for the stage pods (mounted read-only)."""

    pvc: PvcLocation | None = Field(default=None, description="A shared PVC: one copy serves all.")
    host_path: HostPathStorage | None = Field(
        default=None, description="Node-local copies; stage pods go only where a copy is verified."
    )


class ArtifactExpectations(ApiModel):
    """What the GGUF headers must say; provisioning fails when they disagree."""

    architecture: str | None = Field(
        default=None, max_length=MAX_NAME, description="general.architecture, e.g. llama."
    )
    block_count: int | None = Field(
        default=None, ge=1, le=4096, description="<arch>.block_count: the number of layers."
    )


class ArtifactManifest(ApiModel):
    """What the model is: its exact files and the facts its headers must show. All that
    verifying a folder needs; `meshnet artifact manifest` writes it."""

    files: list[ArtifactFile] = Field(
        min_length=1, max_length=MAX_FILES,
        description="Every file of the model; the manifest digest is computed over them.",
        json_schema_extra=validations(
            rule("self.all(f, self.exists_one(g, g.name == f.name))",
                 "file names must be unique"),
            rule("self.filter(f, has(f.role) && f.role == 'Drafter').size() <= 1",
                 "at most one file has role Drafter"),
            rule("self.exists(f, !has(f.role) || f.role == 'Model')",
                 "at least one file has role Model"),
        ),
    )
    expectations: ArtifactExpectations = Field(
        default_factory=ArtifactExpectations, description="Facts the GGUF headers must match.",
    )

    @model_validator(mode="after")
    def _roles(self) -> ArtifactManifest:
        """The role rules again (the CEL ones above), for manifests read from files."""
        roles = [f.role or "Model" for f in self.files]
        if roles.count("Drafter") > 1 or "Model" not in roles:
            raise ValueError("a manifest has at least one file of role Model and at most one"
                             " of role Drafter")
        return self

    def manifest_digest(self) -> str:
        """The artifact identity: same files, same digest (docs/architecture.md)."""
        return manifest_digest((f.name, f.size, f.sha256) for f in self.files)

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def model_file(self) -> str:
        """The file llama.cpp opens: the model's first split (the others are found beside
        it), never its drafter."""
        return sorted(f.name for f in self.files if f.role != "Drafter")[0]

    def drafter_file(self) -> str | None:
        """The DSpark drafter GGUF among the files, if the manifest names one."""
        return next((f.name for f in self.files if f.role == "Drafter"), None)


class ModelArtifactSpec(ArtifactManifest):
    """The desired model: its manifest, the files' source and their storage."""

    source: ArtifactSource = Field(description="Where the files come from.")
    storage: ArtifactStorage = Field(description="Where the verified files are kept.")


class ArtifactProgress(StatusModel):
    """How much of the artifact is verified."""

    files_verified: int = Field(default=0, ge=0, description="Files whose sha256 matched.")
    files_total: int = Field(default=0, ge=0, description="Files in the manifest.")
    bytes_verified: int = Field(default=0, ge=0, description="Bytes hashed and matched.")
    bytes_total: int = Field(default=0, ge=0, description="Bytes in the manifest.")


class GgufDrafter(StatusModel):
    """The drafter the artifact carries, from its headers."""

    kind: DrafterApiName = Field(
        description="MTP: the model's own multi-token-prediction blocks; DSpark: the file of"
                    " role Drafter.")
    target_layers: list[int] = Field(
        default_factory=list, description="Main layers whose outputs it reads (0-based): the"
        " last stage of a route drafting with it must own them all.")
    vocab_size: int = Field(default=0, description="Its vocabulary's size.")
    tensor_bytes: int = Field(default=0, description="Bytes of its weights.")
    file: str | None = Field(default=None, description="The DSpark GGUF; absent for MTP.")


class GgufFacts(StatusModel):
    """Facts read from the GGUF headers."""

    architecture: str | None = Field(default=None, description="general.architecture.")
    block_count: int | None = Field(
        default=None, description="<arch>.block_count: layers, MTP blocks included."
    )
    layers: int | None = Field(
        default=None, description="Main layers, which a route's stages must cover together"
        " (blockCount less the MTP blocks).",
    )
    embedding_length: int | None = Field(default=None, description="n_embd.")
    boundary_schema: Literal["DENSE_RESIDUAL", "MHC_RESIDUAL"] | None = Field(
        default=None, description="Typed boundary exchanged between stages."
    )
    boundary_shape: list[int] = Field(
        default_factory=list, description="Boundary shape per token, e.g. [576] or [4, 4096]."
    )
    hash_layer_count: int | None = Field(
        default=None, ge=1,
        description="Leading layers that route experts by token id (deepseek4): a stage starting "
        "inside them takes the token IDs beside the boundary. Absent when there are none.",
    )
    drafter: GgufDrafter | None = Field(
        default=None, description="The drafter the artifact carries (MTP blocks in the model, or"
        " a DSpark GGUF); absent when it has none.",
    )


class CopyVerification(StatusModel):
    """When a copy's bytes were last checked, and how. A file whose verified marker matches
    is not hashed again: the marker checks only size and mtime, so bytes changed in place
    with the mtime put back pass until the next full re-hash."""

    checked_at: str = Field(description="When the last pull or re-hash of the copy finished.")
    hashed_bytes: int = Field(default=0, ge=0, description="Bytes whose sha256 it computed.")
    marker_bytes: int = Field(
        default=0, ge=0,
        description="Bytes it accepted by their verified marker (size and mtime only).")
    next_full_hash_at: str | None = Field(
        default=None,
        description="When the operator re-hashes every byte of the copy (absent: never).")


class NodeCopy(StatusModel):
    """One node's copy of a host-path artifact."""

    node: str = Field(description="Node name.")
    verified: bool = Field(default=False, description="True when every file matched.")
    message: str = Field(default="", description="Why the copy is not verified yet.")
    verification: CopyVerification | None = Field(
        default=None, description="When and how the copy was last checked.")


class ModelArtifactStatus(StatusModel):
    """Observed state, written by the provisioning controller."""

    observed_generation: int | None = Field(default=None, description="Last generation handled.")
    manifest_digest: str | None = Field(default=None, description="sha256 of the manifest.")
    short_digest: str | None = Field(default=None, description="First 12 digits of the digest.")
    size: str | None = Field(default=None, description="Total size, human-readable.")
    progress: ArtifactProgress | None = Field(default=None, description="Verification progress.")
    gguf: GgufFacts | None = Field(default=None, description="Facts from the GGUF headers.")
    nodes: list[NodeCopy] = Field(default_factory=list, description="Per-node copies (hostPath).")
    verification: CopyVerification | None = Field(
        default=None, description="When and how the PVC's copy was last checked.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Failed.",
        json_schema_extra=CONDITIONS_LIST,
    )


class ModelArtifact(ApiModel):
    """An exact split-GGUF model with a complete hashed manifest, verified on storage."""

    api_version: str = Field(default="meshnet.dev/v1alpha1", description="meshnet.dev/v1alpha1.")
    kind: Literal["ModelArtifact"] = Field(default="ModelArtifact", description="ModelArtifact.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Standard metadata.")
    spec: ModelArtifactSpec
    status: ModelArtifactStatus | None = None


def human_size(size: int) -> str:
    """1536 -> '1.5KiB': the Size column of `kubectl get ma`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")
