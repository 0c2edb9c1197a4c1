"""What one stage's worker serves, typed, as the plan decides it (pure). Both backends
render it to a command line with `worker_command`, adding where it runs."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.reconcile.route.identity import LinkTls
from meshnet.reconcile.route.topology import UNLINKED, StageLinks


@dataclass(frozen=True)
class Identities:
    """What a worker reports in GetInfo, so that the driver's handshake and the Tracker
    report can tell a stage started for another artifact, recipe or route."""

    manifest_digest: str
    recipe_digest: str
    route_digest: str


@dataclass(frozen=True)
class LoopSpeculation:
    """What a first stage's decode loops may speculate: at most `drafts` per verify window
    (0: they decode plainly, whatever a caller asks) and `windows` windows in flight."""

    drafts: int
    windows: int


@dataclass(frozen=True)
class StageDrafter:
    """The drafter a last stage hosts: `kind` (the worker's --drafter) drafting
    up to `max_drafts` tokens after each token it samples; `model_file` the DSpark GGUF
    within the artifact (None for the model's own MTP blocks)."""

    kind: DrafterKind
    max_drafts: int
    model_file: str | None = None


@dataclass(frozen=True)
class WorkerSpec:
    """One stage's worker: its layers, what it serves them for and how it is linked."""

    stage: str  # the stage's name in the route
    layers: LayerRange
    route_id: str  # namespace/name of the route
    epoch: int
    identities: Identities
    model_file: str  # the GGUF file (the first of a split set) within the artifact
    slots: int
    context_length: int
    boundary_dtype: str
    pipeline_depth: int  # stages in the route
    offload: bool = False  # every layer it owns, and the last stage's head, on its GPUs
    # Served with the route's certificate (None: plaintext), and asking callers for one
    # signed by the route's CA when it says so.
    tls: LinkTls | None = None
    route_key_secret: str | None = None  # the Secret whose route.key the pod mounts
    links: StageLinks = UNLINKED  # the stages it relays to, by name (of its own replica)
    replica: int = 0  # the route's pipeline it belongs to; its links stay within it
    drafter: StageDrafter | None = None  # the last stage's, when the recipe drafts with one
    loop: LoopSpeculation | None = None  # the first stage's (the one whose loops draft)
    # Positions one rejected draft may drop at once (0: the route does not speculate); a
    # deepseek4 stage keeps that many rollback snapshots per session, a llama one none.
    discard_depth: int = 0
    # Prefix cache: released slots kept (0: off) and the block it reuses in.
    prefix_cache_entries: int = 0
    prefix_block: int = 0
    # Sessions share engine steps as upstream batches (recipe.batching Throughput), not only
    # where the stage measured them exact.
    throughput_batching: bool = False
    # Packs the boundaries it relays to its next stage (spec.boundaryCompression: the
    # decision of linkcompression.py for the leg it sends on).
    compress_boundaries: bool = False
