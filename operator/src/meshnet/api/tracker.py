"""The capacity report sent to the Meshnet Tracker, version `meshnet.tracker/v1`.

One report describes one route: who serves it, what it serves (artifact and recipe
identities), every stage's health, capacity, load and seam cost, the lane's
certification, and whether the route is available at all. The published JSON schema
(`schemas/`) is generated from these models; `meshnet tracker schema --check` fails
when the two drift apart.

Not available: `available` is false, `unavailableReasons` lists every reason (codes
from `UnavailableReason`) and `capacity.sessionSlotsAdvertised` is 0. The Tracker must
route nothing to such a route, whatever its measured figures say.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from meshnet.api.certification import DIGEST_PATTERN, Backend, Certificate, CertifiedLane
from meshnet.api.common import ApiModel

API_VERSION: Literal["meshnet.tracker/v1"] = "meshnet.tracker/v1"
KIND: Literal["CapacityReport"] = "CapacityReport"
SCHEMA_ID = "https://meshnet.dev/schemas/tracker/v1/capacityreport.json"

UnavailableReason = Literal[
    "LaneNotCertified",  # no certificate for this exact lane yet (or only for another lane)
    "CertificationFailed",  # this lane's certificate failed parity or speed
    "RouteNotReady",  # the route is not Ready (starting, rolling out, invalid)
    "StageNotReady",  # a stage's pod/process is not ready
    "StageUnreachable",  # GetInfo/GetCapacity failed or timed out
    "StageMismatch",  # a worker answers for another route, epoch, range or artifact
    "RouteDeleted",  # the route is being deleted: withdraw it
]


class Provider(ApiModel):
    """Who serves the route."""

    id: str = Field(min_length=1, max_length=253, description="Provider id.")
    cluster: str = Field(min_length=1, max_length=253,
                         description="Cluster id (the operator's), or the host for `meshnet up`.")


class RouteIdentity(ApiModel):
    """Which route this is."""

    name: str = Field(min_length=1, max_length=253, description="ShardRoute name.")
    namespace: str = Field(min_length=1, max_length=253, description="Its namespace.")
    epoch: int = Field(ge=0, description="Increments exactly when routeDigest changes.")
    route_digest: str | None = Field(pattern=DIGEST_PATTERN,
                                     description="null until the route has an identity.")
    endpoint: str | None = Field(
        default=None, max_length=2048,
        description="Where clients send requests: the route's OpenAI-compatible base URL"
                    " (its gateway); null when it has none.")


class ArtifactFacts(ApiModel):
    """What model the route serves."""

    manifest_digest: str | None = Field(pattern=DIGEST_PATTERN, description="Artifact identity.")
    architecture: str | None = Field(max_length=64, description="GGUF architecture.")
    block_count: int | None = Field(ge=1, description="Layers (blocks) of the model.")


class RecipeFacts(ApiModel):
    """How the route runs it (everything that can change numerics)."""

    recipe_digest: str | None = Field(pattern=DIGEST_PATTERN, description="Recipe identity.")
    llama_cpp_commit: str = Field(pattern=r"^([0-9a-f]{40}|unknown)$",
                                  description="The pinned llama.cpp commit.")
    patch_stack_digest: str = Field(pattern=r"^([0-9a-f]{64}|unknown)$",
                                    description="sha256 over the ordered patch sha256 list.")
    backend: Backend = Field(description="Backend lane.")
    boundary_dtype: Literal["f32", "f16", "bf16"] = Field(description="Boundary element type.")
    context_length: int = Field(ge=1, description="Per-session context, in tokens.")
    session_slots: int = Field(ge=1, description="Sessions each stage keeps KV for.")
    batching: Literal["Exact", "Throughput"] = Field(
        default="Exact",
        description="Exact: sessions share engine steps only where each stage measured their"
                    " rows to compute as alone, so a session's tokens do not depend on the"
                    " load. Throughput: stages batch as upstream llama.cpp does, and a"
                    " session's tokens may depend on what else the route runs.")


class LayerSpan(ApiModel):
    """A half-open layer range [begin, end)."""

    begin: int = Field(ge=0, description="First owned layer.")
    end: int = Field(ge=1, description="One past the last owned layer.")


class StageHealth(ApiModel):
    """Whether the stage can serve now."""

    ready: bool = Field(description="Reachable, consistent with the route, and its pod ready.")
    reachable: bool = Field(description="GetInfo and GetCapacity answered in time.")
    incarnation: str | None = Field(max_length=256,
                                    description="The worker process's random id.")
    uptime_seconds: float | None = Field(
        ge=0, description="Since the worker started (from the pod or process; otherwise since"
                          " this reporter first saw its incarnation).")
    restarts: int = Field(ge=0, description="Restarts of the stage's worker.")
    problem: str | None = Field(max_length=4096, description="Why it is not ready.")


class StageCapacity(ApiModel):
    """GetCapacity: room for sessions and their KV."""

    session_slots_free: int = Field(ge=0, description="Slots a new session can take.")
    session_slots_total: int = Field(ge=0, description="Concurrent sessions it keeps KV for.")
    kv_tokens_free: int = Field(ge=0, description="Free KV cells (tokens).")
    kv_tokens_total: int = Field(ge=0, description="All KV cells (tokens).")


class StageLoad(ApiModel):
    """GetCapacity: how busy the stage is."""

    queue_depth: int = Field(ge=0, description="Steps waiting for the engine.")
    active_sessions: int = Field(ge=0, description="Sessions holding a slot.")
    recent_tokens_per_second: float = Field(ge=0, description="Over the last ~10 s.")


class Seam(ApiModel):
    """What crossing this stage's output boundary costs per token."""

    boundary_bytes_per_token: int = Field(ge=0, description="Payload bytes per token (0 on the"
                                                            " last stage: nothing leaves it).")
    dtype: Literal["f32", "f16", "bf16"] = Field(description="Boundary element type.")


class StageReport(ApiModel):
    """One stage: range, endpoint, health, capacity, load and seam cost."""

    name: str = Field(min_length=1, max_length=63, description="Stage name.")
    layers: LayerSpan = Field(description="The owned layer range.")
    endpoint: str | None = Field(max_length=512, description="host:port of its gRPC service.")
    health: StageHealth = Field(description="Whether it can serve now.")
    capacity: StageCapacity | None = Field(description="null when the stage did not answer.")
    load: StageLoad | None = Field(description="null when the stage did not answer.")
    seam: Seam | None = Field(description="null when the stage did not answer.")


class RouteCapacity(ApiModel):
    """The route as a whole: the smallest free figures over the stages, the busiest load.
    A route of several replicas sums these over its ready replicas (see `replicas`)."""

    # A session needs a slot and KV cells on every stage of one pipeline at once.

    session_slots_advertised: int = Field(
        ge=0, description="Sessions the Tracker may send now: sessionSlotsFree when available,"
                          " else 0.")
    session_slots_free: int | None = Field(
        ge=0, description="Smallest free slots over the stages (null: a stage did not answer);"
                          " summed over the ready replicas.")
    session_slots_total: int | None = Field(ge=0, description="Smallest slot count (summed over"
                                                              " the ready replicas).")
    kv_tokens_free: int | None = Field(ge=0, description="Smallest free KV cells (summed).")
    kv_tokens_total: int | None = Field(ge=0, description="Smallest KV cell count (summed).")
    queue_depth: int | None = Field(ge=0, description="Deepest engine queue over the stages"
                                                      " (summed).")
    active_sessions: int | None = Field(ge=0, description="Most sessions held by one stage"
                                                          " (summed).")
    recent_tokens_per_second: float | None = Field(ge=0, description="The last stage's (summed).")


class ReplicaReport(ApiModel):
    """One replica of the route: the pipeline serving it and what it can take."""

    replica: int = Field(ge=0, description="The replica's index.")
    epoch: int = Field(ge=0, description="The epoch of the pipeline serving it (an older one"
                                         " while a rollout has not reached it).")
    ready: bool = Field(description="Every stage answered, ready and consistent: counted in"
                                    " capacity.")
    session_slots_free: int | None = Field(ge=0, description="Smallest free slots over its"
                                                             " stages.")
    session_slots_total: int | None = Field(ge=0, description="Smallest slot count.")
    active_sessions: int | None = Field(ge=0, description="Most sessions held by one stage.")
    problem: str | None = Field(default=None, max_length=4096,
                                description="Why it is not ready.")


class CertificationState(ApiModel):
    """The lane the route runs on and whether it is certified."""

    lane: CertifiedLane | None = Field(description="The lane the route runs on now (null until"
                                                   " its identity and nodes are known).")
    passed: bool = Field(description="A passing certificate of exactly this lane exists.")
    certificate: Certificate | None = Field(
        description="The latest certificate (it may be for another lane: compare lanes).")


class Unavailable(ApiModel):
    """One reason a route is not available."""

    reason: UnavailableReason = Field(description="A code from the fixed set (see "
                                                  "docs/tracker.md).")
    stage: str | None = Field(default=None, description="The stage concerned, if one.")
    message: str = Field(max_length=4096, description="What was seen, in words.")


def _availability_rules(schema: dict[str, Any]) -> None:
    """available=true only with a passing certificate and no reasons; false with at least
    one reason and nothing advertised. The Tracker can rely on it by validating."""
    schema["allOf"] = [{
        "if": {"properties": {"available": {"const": True}}},
        "then": {"properties": {
            "unavailableReasons": {"maxItems": 0},
            "certification": {"properties": {"passed": {"const": True}}},
        }},
        "else": {"properties": {
            "unavailableReasons": {"minItems": 1},
            "capacity": {"properties": {"sessionSlotsAdvertised": {"const": 0}}},
        }},
    }]


class CapacityReport(ApiModel, json_schema_extra=_availability_rules):
    """One route's capacity report."""

    api_version: Literal["meshnet.tracker/v1"] = Field(default=API_VERSION,
                                                       description="Report version.")
    kind: Literal["CapacityReport"] = Field(default=KIND, description="CapacityReport.")
    sequence: int = Field(ge=0, description="Increases with every report of this route by this"
                                            " reporter (a restarted reporter starts again).")
    generated_at: str = Field(description="When the figures were collected (RFC 3339, UTC).")
    provider: Provider = Field(description="Who serves the route.")
    route: RouteIdentity = Field(description="Which route.")
    artifact: ArtifactFacts = Field(description="Compatibility: the model.")
    recipe: RecipeFacts = Field(description="Compatibility: how it runs.")
    stages: list[StageReport] = Field(description="In pipeline order.")
    capacity: RouteCapacity = Field(description="The route as a whole.")
    replicas: list[ReplicaReport] | None = Field(
        default=None, description="Every replica, by index (absent: a reporter that does not"
                                  " know replicas, e.g. `meshnet up`: `stages` is the route).")
    certification: CertificationState = Field(description="The lane's certification.")
    available: bool = Field(description="The Tracker may route sessions here.")
    unavailable_reasons: list[Unavailable] = Field(
        description="Every reason the route is not available (empty when it is).")


class MeasuredCapacity(ApiModel):
    """status.tracker.capacity: the report's route capacity (absent figures: unknown)."""

    session_slots_advertised: int = Field(default=0, ge=0,
                                          description="Sessions offered (0 unless available).")
    session_slots_free: int | None = Field(default=None, ge=0,
                                           description="Smallest free slots over the stages.")
    session_slots_total: int | None = Field(default=None, ge=0,
                                            description="Smallest slot count over the stages.")
    kv_tokens_free: int | None = Field(default=None, ge=0,
                                       description="Smallest free KV cells over the stages.")
    kv_tokens_total: int | None = Field(default=None, ge=0,
                                        description="Smallest KV cell count over the stages.")
    queue_depth: int | None = Field(default=None, ge=0,
                                    description="Deepest engine queue over the stages.")
    active_sessions: int | None = Field(default=None, ge=0,
                                        description="Most sessions held by one stage.")


class TrackerStatus(ApiModel):
    """ShardRoute status.tracker: what the latest report said, for `kubectl get`."""

    available: bool = Field(description="The latest report says available.")
    unavailable_reasons: list[Unavailable] = Field(
        default_factory=list, description="Why not (empty when available).")
    capacity: MeasuredCapacity | None = Field(default=None, description="Measured capacity.")
    lane: CertifiedLane | None = Field(default=None, description="The lane the route runs on.")
    delivery_error: str | None = Field(
        default=None, max_length=1024,
        description="Why the latest report did not reach the Tracker (null: it did, or no"
                    " Tracker is configured).")
