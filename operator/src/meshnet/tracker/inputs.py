"""What a report is built from, as plain data: the backend's view of the route and its
stages (Kubernetes objects or local processes) and what each worker answered."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.api.shardroute import Recipe


@dataclass(frozen=True)
class RouteView:
    """The route as its backend sees it."""

    name: str
    namespace: str
    route_id: str  # what its workers were started with (--route-id)
    recipe: Recipe
    epoch: int = 0
    route_digest: str | None = None
    manifest_digest: str | None = None
    recipe_digest: str | None = None
    architecture: str | None = None
    block_count: int | None = None
    ready: bool = False
    not_ready: str = ""  # why not (the Ready condition's message)
    deleting: bool = False
    endpoint: str | None = None  # the gateway's OpenAI base URL, when the route has one


@dataclass(frozen=True)
class StageView:
    """One stage as its backend sees it (pod or process)."""

    name: str
    begin: int
    end: int
    endpoint: str | None  # where to dial it; None: no pod/process of this epoch
    ready: bool = False
    restarts: int = 0
    started_at: float | None = None  # unix time the worker started, when known
    problem: str = ""  # why the backend says it is not ready


@dataclass(frozen=True)
class ReplicaView:
    """One ready replica of the route and the stages of the pipeline serving it."""

    replica: int
    epoch: int
    stages: list[StageView]


@dataclass(frozen=True)
class WorkerInfo:
    """GetInfo, reduced to what the report and the consistency checks need."""

    route_id: str
    epoch: int
    incarnation: str
    manifest_digest: str
    recipe_digest: str
    route_digest: str
    architecture: str
    n_layer: int
    begin: int
    end: int
    boundary_dtype: str  # f32 | f16 | bf16
    boundary_row_elements: int
    # What it measured at start to compute exactly, and whether it batches for throughput.
    exact_step_rows: int = 0
    exact_batching: bool = False
    throughput_batching: bool = False


@dataclass(frozen=True)
class WorkerCapacity:
    """GetCapacity."""

    slots_free: int
    slots_total: int
    kv_tokens_free: int
    kv_tokens_total: int
    queue_depth: int
    active_sessions: int
    recent_tokens_per_second: float
    # A last stage's speculative draft tokens since it started: verified, and accepted.
    draft_tokens_verified: int = 0
    draft_tokens_accepted: int = 0


@dataclass(frozen=True)
class StageSample:
    """What one worker answered within the timeout (error: why not)."""

    endpoint: str
    info: WorkerInfo | None = None
    capacity: WorkerCapacity | None = None
    error: str | None = None


@dataclass(frozen=True)
class PinFacts:
    """The llama.cpp build every recipe rests on."""

    llama_cpp_commit: str = "unknown"
    patch_stack_digest: str = "unknown"
