"""The ShardRoute resource: which artifact, which runtime recipe and which stages
(layer ranges and placement) make one served pipeline (docs/architecture.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from meshnet.api.certification import Certificate
from meshnet.api.common import (
    CONDITIONS_LIST,
    MAX_NAME,
    MAX_STAGES,
    ApiModel,
    Batching,
    Condition,
    LocalObjectReference,
    Quantity,
    StatusModel,
    Topology,
    rule,
    validations,
)
from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.tracker import TrackerStatus

KIND = "ShardRoute"
PLURAL = "shardroutes"

Lane = Literal["cpu", "cuda", "rocm", "vulkan"]
BoundaryDtype = Literal["f32", "f16", "bf16"]

# The extended resource a stage's GPUs are requested as, by lane; on other lanes a stage
# with GPUs names its resource (resources.gpuResourceName).
DEFAULT_GPU_RESOURCES = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}
GPU_RESOURCE_RULE = (
    "(has(self.recipe) && has(self.recipe.lane) && self.recipe.lane in ["
    + ", ".join(f"'{lane}'" for lane in DEFAULT_GPU_RESOURCES)
    + "]) || self.stages.all(s, !has(s.resources) || !has(s.resources.gpus)"
    " || s.resources.gpus == 0 || has(s.resources.gpuResourceName))"
)

# Stages in list order must chain: stage i ends where stage i+1 begins. Standard CEL has
# no range(), so the index list is spelled out up to MAX_STAGES.
_INDICES = "[" + ", ".join(str(i) for i in range(MAX_STAGES - 1)) + "]"
CONTIGUOUS_RULE = (
    f"{_INDICES}.all(i, i + 1 >= size(self)"
    " || self[i].layers.end == self[i + 1].layers.begin)"
)


# Speculative decoding's bounds, as the route driver and the worker have them
# (meshnet.route.drafts MAX_DRAFT and MAX_WINDOWS; a test keeps them equal): a verify
# window of 8 rows is the widest whose rows the CPU lane computes exactly as one-row steps,
# and a first stage keeps at most 8 windows in flight.
MAX_DRAFTS = 7
MAX_WINDOWS = 8
SpeculationMode = Literal["Disabled", "Lookup", "MTP", "DSpark"]


class Speculation(ApiModel):
    """Speculative decoding on the route: drafts verified in one step through every stage.
    Exact by construction (the tokens are those of plain decoding, greedy or sampled), so
    it is not part of recipeDigest: changing it keeps the epoch and replaces the stage pods
    (their worker flags change) and the gateway at the same epoch."""

    mode: SpeculationMode = Field(
        default="Disabled",
        description="Disabled (the gateway does not speculate, and the first stage's decode"
                    " loops decode plainly whatever a client asks); Lookup: drafts by"
                    " prompt lookup over the session's own context; MTP: drafts by the"
                    " model's own multi-token-prediction layers; DSpark: drafts by the"
                    " artifact's DSpark drafter GGUF (its file of role Drafter). MTP and"
                    " DSpark run on the last stage, which must own every layer the drafter"
                    " reads; it sends its drafts with each token to the first stage. Every"
                    " draft is verified exactly at the last stage.",
    )
    max_drafts: int = Field(
        default=6, ge=1, le=MAX_DRAFTS,
        description="Most draft tokens per verify window (the step is drafts + 1 rows; 7 is"
                    " the widest whose rows compute exactly as one-row steps). The length"
                    " adapts below it to how drafts fare; a rejected draft costs its rows on"
                    " every stage.",
    )
    max_windows: int = Field(
        default=4, ge=1, le=MAX_WINDOWS,
        description="Most verify windows the first stage keeps in flight on a chain or ring"
                    " (pipelined speculation: each assumes the ones before it accepted;"
                    " a hub keeps one). A rejection drops every later window, so windows x"
                    " (maxDrafts + 1) - 1 positions is what one rejection may drop at once:"
                    " deepseek4 stages keep that many rollback snapshots per session.",
    )

    @property
    def enabled(self) -> bool:
        return self.mode != "Disabled"

    def stage_drafter(self) -> DrafterKind | None:
        """The drafter the last stage hosts (modes MTP, DSpark), None when drafts are
        looked up (or there are none)."""
        return DrafterKind.from_api(self.mode)

    def loop_drafts(self) -> int:
        """The drafts a first stage's decode loop may take per window (0: none)."""
        return self.max_drafts if self.enabled else 0

    def loop_windows(self) -> int:
        """The verify windows it may keep in flight (1 while disabled: windows without
        drafts are plain steps, and the setting of a disabled mode changes no pod)."""
        return self.max_windows if self.enabled else 1

    def discard_depth(self) -> int:
        """Positions one rejection may drop at once (0 while disabled): every window in
        flight after the rejected one, each a token and its drafts."""
        return self.max_windows * (self.max_drafts + 1) - 1 if self.enabled else 0


# The most tokens a stage takes in one step: the worker's --batch, which the operator leaves
# at its default (worker_command). A prefix block is prefilled as one step, so no larger.
MAX_STEP_TOKENS = 512
PREFIX_BLOCK_RULE = rule(
    f"!has(self.block) || self.block <= {MAX_STEP_TOKENS}",
    f"block must be at most {MAX_STEP_TOKENS}, the tokens a stage takes in one step: a"
    " block is prefilled as one step",
    fieldPath=".block",
)


# The prefix cache where a recipe leaves it out: on, on the lanes whose exactness on the
# grid was shown (the CPU lane: tests/route/test_prefix_cache.py) and where cutting prefills
# on the grid was measured to cost nothing (bench/prefix_bench.py --grid, BENCHMARKS.md);
# its block by architecture. deepseek4's logits depend on where its steps begin and end, and
# a route without the cache cuts its prefills in steps of MAX_STEP_TOKENS from position 0:
# that grid gives a cache-on route the very tokens of a cache-off one (the architectures
# are meshnet.route.handshake's STEP_SENSITIVE_ARCHITECTURES; a test keeps them equal).
DEFAULT_PREFIX_ENTRIES = 4
DEFAULT_PREFIX_LANES = frozenset({"cpu"})
DEFAULT_PREFIX_BLOCK = 128
DEFAULT_PREFIX_BLOCKS = {"deepseek4": MAX_STEP_TOKENS}


class PrefixCache(ApiModel, json_schema_extra=validations(PREFIX_BLOCK_RULE)):
    """Prefix reuse on every stage (docs/architecture.md, "Prefix cache"): a session whose
    prompt starts with a cached prefix copies its KV instead of computing it, bit for bit
    what a cold run computes. It changes no tokens, so it is not part of recipeDigest."""

    entries: int | None = Field(
        default=None, ge=0, le=1024,
        description="Released sessions' slots each stage keeps for their prefix; 0: off."
                    f" Default: {DEFAULT_PREFIX_ENTRIES} on the"
                    f" {', '.join(sorted(DEFAULT_PREFIX_LANES))} lane, off on the others"
                    " (not measured there). An entry only holds a slot no live session needs"
                    " (within sessionSlots x contextLength of KV, allocated either way) and"
                    " gives it up first.",
    )
    block: int | None = Field(
        default=None, ge=1, le=4096,
        description="Tokens per reusable block: prefills are cut at multiples of it from"
                    " position 0 and a prefix is reused in whole blocks. Each block is one"
                    f" step, so at most {MAX_STEP_TOKENS} (the tokens a stage takes in one"
                    " step). Default by the model's architecture:"
                    f" {', '.join(f'{a} {b}' for a, b in DEFAULT_PREFIX_BLOCKS.items())}"
                    f" (the steps its prefills take without the cache), others"
                    f" {DEFAULT_PREFIX_BLOCK}.",
    )

    def stage_entries(self, lane: str) -> int:
        """The entries each stage keeps (0: off), the lane's default where unset."""
        if self.entries is not None:
            return self.entries
        return DEFAULT_PREFIX_ENTRIES if lane in DEFAULT_PREFIX_LANES else 0

    def stage_block(self, architecture: str | None) -> int:
        """The block, the architecture's default where unset."""
        if self.block is not None:
            return self.block
        return DEFAULT_PREFIX_BLOCKS.get(architecture or "", DEFAULT_PREFIX_BLOCK)


# Recipe fields removed, still accepted with a warning naming what replaced them for one
# minor version after the last release that had them (then refused as unknown fields).
# recipe.mtp (0.1) was reserved: only Disabled, no multi-token prediction, was accepted.
REMOVED_MTP = ("mtp was removed: multi-token prediction is recipe.speculation (mode MTP"
               " drafts with the model's MTP layers)")
MTP_RULES = (
    rule("!has(self.mtp) || self.mtp == 'Disabled'",
         f"{REMOVED_MTP}; only its one value, Disabled, is still accepted (with a warning)",
         fieldPath=".mtp"),
    rule("!has(self.mtp) || !has(self.speculation) || !has(self.speculation.mode)"
         " || self.speculation.mode != 'MTP'",
         f"{REMOVED_MTP}; mtp: Disabled contradicts speculation.mode MTP: remove mtp",
         fieldPath=".mtp"),
)


class Recipe(ApiModel, json_schema_extra=validations(*MTP_RULES)):
    """The runtime recipe: every input that changes numerics or capacity (recipeDigest)."""

    lane: Lane = Field(default="cpu", description="Backend lane: cpu, cuda, rocm or vulkan.")
    boundary_dtype: BoundaryDtype = Field(
        default="f32", description="Element type of the boundary tensor between stages."
    )
    context_length: int = Field(
        default=4096, ge=16, le=1048576, description="Context length per session, in tokens."
    )
    session_slots: int = Field(
        default=4, ge=1, le=1024, description="Concurrent sessions each stage keeps KV for."
    )
    image: str | None = Field(
        default=None, max_length=1024,
        description="Worker image override; defaults to the operator's image for the lane.",
    )
    topology: Topology = Field(
        default="hub",
        description="How a step goes through the stages: hub (the gateway calls each stage in"
                    " turn, 2S network legs per decoded token for S stages), chain (each stage"
                    " relays to the next, 2(S-1)) or ring (a chain whose first stage also takes"
                    " the last stage's sampled tokens straight, S: the one for a WAN).",
    )
    speculation: Speculation = Field(
        default_factory=Speculation,
        description="Speculative decoding (default: Disabled). Exact by construction: the"
                    " tokens are those of plain decoding, so it is not part of recipeDigest"
                    " and changing it keeps the epoch; it replaces the stage pods whose"
                    " worker flags change (the first stage's drafts and windows, every"
                    " stage's discard depth) and rolls the gateway, at the same epoch.",
    )

    batching: Batching = Field(
        default="Exact",
        description="How a stage lets concurrent sessions share its engine steps. Exact (the"
                    " default): only as far as the stage measured at start that their rows"
                    " compute as alone (else each session steps alone), so a session's tokens"
                    " never depend on the load. Throughput: as upstream llama.cpp batches,"
                    " faster under load on devices whose kernels are not batch invariant"
                    " (GPUs), and then a session's tokens may depend on what else runs (the"
                    " route's status says so). Speculation runs only where exact either way."
                    " Throughput enters recipeDigest.",
    )

    prefix_cache: PrefixCache = Field(
        default_factory=PrefixCache,
        description="Prefix reuse across requests (default: on, on the cpu lane; entries:"
                    " 0 turns it off). Exact: a hit gives the tokens of a cold run, so it is"
                    " not part of recipeDigest; changing it replaces the stage pods at the"
                    " same epoch.",
    )

    mtp: str | None = Field(
        default=None, max_length=16,
        description="Removed: use speculation. Manifests of 0.1 carry mtp: Disabled (no"
                    " multi-token prediction), still accepted with a warning (speculation"
                    " decides) until the next minor version; any other value is refused.",
    )

    def removed_fields(self) -> list[str]:
        """Warnings for the removed fields this recipe still carries, naming what replaced
        them (the value itself is checked by MTP_RULES and checks.removed_field_problems)."""
        if self.mtp is None:
            return []
        return [f"spec.recipe.mtp: {REMOVED_MTP}; mtp: {self.mtp} is ignored (it meant no"
                " multi-token prediction, which recipe.speculation decides now) and will be"
                " refused after the next minor version: remove it"]

    def identity(self) -> dict[str, Any]:
        """The recipe fields that enter recipeDigest. The image is placement, the topology
        the path a step takes and speculation how many tokens a step tries, none numerics:
        every topology and every speculation setting give the same tokens, so changing
        them replaces the stage pods at the same epoch."""
        identity: dict[str, Any] = {
            "lane": self.lane,
            "boundaryDtype": self.boundary_dtype,
            "contextLength": self.context_length,
            "sessionSlots": self.session_slots,
        }
        if self.batching != "Exact":  # tokens that may depend on the load are other numerics
            identity["batching"] = self.batching
        return identity


class LayerRange(
    ApiModel,
    json_schema_extra=validations(rule(
        "self.begin < self.end", "layers.begin must be less than layers.end",
    )),
):
    """A half-open layer range [begin, end): a stage's in the spec, and the one typed form
    from the plan to the worker's command line. Not checked here for fitting the model: the
    worker's parser (layer_range) refuses what it cannot serve, with the reason."""

    begin: int = Field(ge=0, le=4096, description="First owned layer.")
    end: int = Field(ge=1, le=4096, description="One past the last owned layer.")

    def __init__(self, begin: int, end: int) -> None:
        """Positional too: LayerRange(0, 15), as ranges are written everywhere else."""
        BaseModel.__init__(self, begin=begin, end=end)  # ApiModel's is typed by the fields

    def __str__(self) -> str:
        """The worker's --layers form, BEGIN:END."""
        return f"{self.begin}:{self.end}"

    @classmethod
    def parse(cls, text: str) -> LayerRange:
        """The BEGIN:END form back (`0:15`); ValueError naming the form otherwise."""
        begin, sep, end = text.strip().partition(":")
        if not sep or not begin.isdigit() or not end.isdigit():
            raise ValueError(f"{text!r} is not a layer range BEGIN:END (e.g. 0:15)")
        try:
            return cls(int(begin), int(end))
        except ValueError:  # pydantic's bounds
            raise ValueError(f"{text!r}: layers are 0..4096 and END must be at least 1") \
                from None


class StageResources(ApiModel):
    """Compute resources of one stage pod."""

    gpus: int = Field(default=0, ge=0, le=64, description="GPUs requested (and limited).")
    gpu_resource_name: str | None = Field(
        default=None, max_length=253,
        description="Extended resource for GPUs; defaults per lane (nvidia.com/gpu, amd.com/gpu).",
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: 4, memory: 16Gi."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits.")


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=316, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Operator.")
    value: str | None = Field(default=None, max_length=63, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect."
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute taints.")


class Stage(ApiModel):
    """One pipeline stage: a contiguous layer range served by one worker pod."""

    name: str = Field(
        min_length=1, max_length=MAX_NAME, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Stage name (DNS label), unique within the route.",
    )
    layers: LayerRange = Field(description="The owned layer range [begin, end).")
    resources: StageResources = Field(
        default_factory=StageResources, description="GPUs, requests and limits."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the stage pod requires."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints the stage pod tolerates."
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="Pod affinity rules (core/v1 Affinity), passed through."
    )


TlsMode = Literal["Operator", "Secret", "Disabled"]


class RouteTls(
    ApiModel,
    json_schema_extra=validations(
        rule("!has(self.mode) || self.mode == 'Secret' || !has(self.secretName)",
             "secretName is the certificate of mode Secret; mode Operator issues its own and"
             " Disabled uses none"),
        rule("!has(self.mode) || self.mode != 'Secret' || has(self.secretName)",
             "mode Secret needs secretName"),
    ),
):
    """How the route's links (stages, gateway, certification) are secured. Absent, or mode
    Operator: mTLS with identities the operator issues from the route's own CA. Mode Secret
    (or a secretName alone, as before modes existed): the user's kubernetes.io/tls Secret.
    Mode Disabled: plaintext gRPC, for clusters that secure the network elsewhere."""

    mode: TlsMode | None = Field(
        default=None,
        description="Operator (the default): mTLS on every link, each route's own CA and"
                    " identities in the Secret <route>-identity, renewed by the operator;"
                    " Secret: the certificate of secretName; Disabled: plaintext gRPC.",
    )
    secret_name: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Mode Secret: a Secret with tls.crt, tls.key and ca.crt.",
    )
    require_client_cert: bool = Field(
        default=False,
        description="Mode Secret: require client certificates signed by ca.crt (mTLS). Mode"
                    " Operator always does.",
    )

    def effective_mode(self) -> TlsMode:
        """secretName alone means Secret, as it did before modes existed."""
        return self.mode or ("Secret" if self.secret_name else "Operator")


class GatewayResources(ApiModel):
    """Compute resources of each gateway pod (defaults: 100m CPU, 256Mi; limit 1Gi)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: 500m, memory: 512Mi."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits.")


class Gateway(ApiModel):
    """The route's OpenAI-compatible HTTP front door (`meshnet serve`): a Deployment and a
    Service, ready while the route is servable."""

    enabled: bool = Field(default=True, description="false: no gateway for this route.")
    replicas: int = Field(default=1, ge=1, le=64, description="Gateway pods.")
    max_waiting: int = Field(
        default=16, ge=0, le=100000,
        description="Requests each gateway pod queues beyond the route's session slots"
                    " before it answers 429.",
    )
    resources: GatewayResources = Field(
        default_factory=GatewayResources, description="Requests and limits of each pod."
    )
    api_keys_secret: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="A Secret in the route's namespace whose `api-keys` key holds the API"
                    " keys, one per line: requests to /v1/ then need `Authorization: Bearer"
                    " KEY` (401 invalid_api_key otherwise); /health, /ready and /metrics"
                    " stay open. A changed Secret is read again, no restart.",
    )
    share_cache_across_keys: bool = Field(
        default=False,
        description="With API keys: every key reuses every key's cached prompt prefixes"
                    " (default: each key's are its own, so no key learns what another sent).",
    )
    hide_cached_tokens: bool = Field(
        default=False,
        description="Leave usage.prompt_tokens_details.cached_tokens out of responses.",
    )


class Rollout(
    ApiModel,
    json_schema_extra=validations(rule(
        "!has(self.maxSurge) || self.maxSurge > 0 || !has(self.maxUnavailable)"
        " || self.maxUnavailable > 0",
        "maxSurge and maxUnavailable cannot both be 0: no replica could be replaced")),
):
    """How a new epoch replaces the replicas, and how a replica leaves: one replica at a
    time by default, the new epoch's pipeline started beside the old one, which drains."""

    max_surge: int = Field(
        default=1, ge=0, le=1000,
        description="Pipelines beyond spec.replicas that may run during a rollout (a new"
                    " epoch's beside the old one it replaces, or one draining).",
    )
    max_unavailable: int = Field(
        default=1, ge=0, le=1000,
        description="Replicas that may be without a ready pipeline while the rollout"
                    " replaces them (used when maxSurge is spent); the last serving replica"
                    " is only taken down with maxSurge 0.",
    )
    drain_seconds: int = Field(
        default=60, ge=0, le=86400,
        description="How long a replaced or scaled-away pipeline keeps running after the"
                    " gateway stops sending it new sessions, so that running ones finish (the"
                    " gateway pods' termination grace too); 0 deletes it at once.",
    )


class ShardRouteSpec(
    ApiModel,
    json_schema_extra=validations(rule(
        GPU_RESOURCE_RULE,
        "a stage with GPUs on a lane without a default GPU resource (only "
        + ", ".join(DEFAULT_GPU_RESOURCES) + " have one) must set resources.gpuResourceName",
        fieldPath=".stages",
    )),
):
    """The desired pipeline."""

    artifact_ref: LocalObjectReference = Field(description="The ModelArtifact to serve.")
    replicas: int = Field(
        default=1, ge=0,
        description="Identical pipelines of the route: each a full set of stage pods of the"
                    " same epoch with addresses of its own (0: no stage pods). Placement, not"
                    " numerics: not part of the route's identity, so scaling never changes the"
                    " epoch. The scale subresource sets it (kubectl scale, HPA, KEDA).",
    )
    rollout: Rollout = Field(
        default_factory=Rollout, description="How epochs roll over the replicas and how a"
                                             " replica drains before it goes.")
    recipe: Recipe = Field(default_factory=Recipe, description="The runtime recipe.")
    stages: list[Stage] = Field(
        min_length=1, max_length=MAX_STAGES,
        description="Stages in pipeline order; their ranges must chain without gaps.",
        json_schema_extra=validations(
            rule("self.all(s, self.exists_one(t, t.name == s.name))", "stage names must be unique"),
            rule(CONTIGUOUS_RULE, "stages must be ordered and contiguous: each stage begins"
                 " where the previous one ends (no gaps, no overlaps)"),
            rule("size(self) == 0 || self[0].layers.begin == 0",
                 "the first stage must begin at layer 0: the layers before it would never run"),
        ),
    )
    tls: RouteTls | None = Field(
        default=None,
        description="How the route's links are secured (absent: mTLS with identities the"
                    " operator issues).",
    )
    gateway: Gateway = Field(
        default_factory=Gateway, description="The route's OpenAI-compatible gateway."
    )
    placement: Literal["Static", "Measured"] = Field(
        default="Static",
        description="Which node serves which stage. Static: as the scheduler placed the pods;"
                    " nothing is measured. Measured: the operator measures the links between"
                    " the stages' nodes and, when another order of them is clearly cheaper per"
                    " token, reassigns the stages to the nodes in that order as a new epoch"
                    " (docs/placement.md).",
    )
    boundary_compression: Literal["Auto", "Off", "On"] = Field(
        default="Auto",
        description="Whether a stage packs the boundaries it relays to the next stage"
                    " (shuffle-lz4, lossless: tokens never change, and it is not part of"
                    " recipeDigest, so changing it starts no epoch; the sending stage's pod is"
                    " restarted in place). Auto: only on a leg whose bandwidth, measured by"
                    " spec.placement Measured, is below the break-even (about 416 Mbit/s, the"
                    " operator's MESHNET_COMPRESSION_BREAK_EVEN_MBPS); off on unmeasured and"
                    " faster legs. On: every leg. Off: none. The worker never packs towards"
                    " loopback or a stage that does not take it; status.compressedLegs shows"
                    " the legs told to (docs/placement.md).",
    )


class StageStatus(StatusModel):
    """What was observed of one stage."""

    name: str = Field(description="Stage name.")
    layers: LayerRange = Field(description="Its layer range.")
    pod: str | None = Field(default=None, description="The stage pod of the current epoch.")
    endpoint: str | None = Field(default=None, description="host:port of its gRPC service.")
    ready: bool = Field(default=False, description="The pod passes its gRPC readiness probe.")
    epoch: int | None = Field(default=None, description="The epoch the pod was started for.")
    incarnation: str | None = Field(
        default=None, description="Changes whenever the worker process restarts (pod uid-restarts)."
    )
    restarts: int = Field(default=0, description="Container restarts of the pod.")


class RouteCapacity(StatusModel):
    """Capacity summary of the route."""

    ready_stages: int = Field(
        default=0, description="Stage pods ready at the current epoch, over every replica.")
    total_stages: int = Field(default=0, description="Stages in the spec times replicas.")
    session_slots: int = Field(
        default=0, description="Concurrent sessions the route can serve now: sessionSlots"
                               " times the ready replicas (0 unless Ready)."
    )


class RouteSpeculation(StatusModel):
    """Speculative decoding as the route's last stage counted it since its worker started
    (GetCapacity): the drafts it verified and how many held."""

    acceptance: float | None = Field(
        default=None, ge=0,
        description="draftTokensAccepted / draftTokensVerified, to 3 decimals; absent until"
                    " a draft was verified.",
    )
    draft_tokens_verified: int = Field(
        default=0, ge=0, description="Draft tokens the last stage verified since it started."
    )
    draft_tokens_accepted: int = Field(
        default=0, ge=0, description="Of those, the ones plain decoding would have produced."
    )


class RouteExactness(StatusModel):
    """What the route's stages measured at start to compute exactly (GetInfo), and what the
    route promises from it (docs/architecture.md, "Exactness on every lane")."""

    batching: Batching = Field(description="recipe.batching.")
    load_dependent: bool = Field(
        default=False, description="A session's tokens may depend on the load: stages batch"
                                   " for throughput (recipe.batching Throughput).")
    exact_step_rows: int | None = Field(
        default=None, ge=0, description="The widest step every stage computes as one-row"
                                        " steps (the narrowest stage's); absent until every"
                                        " stage answered.")
    exact_batching: bool | None = Field(
        default=None, description="Every stage's sessions' rows compute as alone in a shared"
                                  " step (else they step alone there); absent until every"
                                  " stage answered.")
    speculation_limit: Literal["NotExact"] | None = Field(
        default=None, description="NotExact: the route speculates with fewer drafts than"
                                  " speculation.maxDrafts, or decodes plainly, because a"
                                  " stage's exact step is narrower than the verify window.")
    message: str = Field(default="", description="The same in words, naming the stages.")


class ReplicaStatus(StatusModel):
    """One replica's pipeline: the stages that serve it (the current epoch's, or during a
    rollout the old epoch's until the new one is ready)."""

    replica: int = Field(ge=0, description="The replica's index (0 to spec.replicas - 1).")
    epoch: int | None = Field(default=None, description="The epoch of the pipeline serving it.")
    ready: bool = Field(default=False, description="Every stage pod of the epoch is ready.")
    stages_ready: str = Field(description="Ready stages, e.g. 3/4.")
    stages: list[StageStatus] = Field(default_factory=list, description="Per-stage state.")


class PlacementLink(StatusModel):
    """One measured link between two of the route's nodes."""

    from_node: str = Field(description="The node that measured.")
    to_node: str = Field(description="The node it measured its link to.")
    rtt_seconds: float = Field(ge=0, description="Median round trip.")
    bytes_per_second: float = Field(gt=0, description="Bandwidth of one transfer.")


PlacementReason = Literal["Measuring", "Measured", "Reassigned", "WaitingForNodes",
                          "MeasurementFailed", "AllStagesPinned", "ReplicasUnsupported"]


class RoutePlacement(StatusModel):
    """What the operator measured of the links between the stages' nodes, and the order of
    the nodes it found best (docs/placement.md)."""

    reason: PlacementReason = Field(description="Where measuring and placing stand.")
    message: str = Field(default="", description="The same in words.")
    measured_at: str | None = Field(default=None, description="When the links were measured.")
    nodes: list[str] = Field(default_factory=list, description="The nodes measured.")
    links: list[PlacementLink] = Field(default_factory=list, description="Every link measured.")
    current_order: list[str] = Field(
        default_factory=list, description="The node of each stage now, in stage order.")
    current_seconds: float | None = Field(
        default=None, description="Network seconds per decoded token in the current order.")
    best_order: list[str] = Field(
        default_factory=list, description="The cheapest order of the nodes (stages the user"
                                          " pinned keep their node).")
    best_seconds: float | None = Field(
        default=None, description="Network seconds per decoded token in the best order.")
    gateway: str | None = Field(
        default=None, description="The measured node nearest the best order's first stage:"
                                  " where the gateway should run (reported, not applied).")
    assignment: dict[str, str] = Field(
        default_factory=dict, description="Stage -> node the operator pinned the stages to"
                                          " (Measured only; empty: the scheduler's choice).")
    attempted_at: str | None = Field(
        default=None, description="When the last measurement was started or failed.")


class ShardRouteStatus(StatusModel):
    """Observed state, rebuilt by the operator from the stage pods on every reconcile."""

    observed_generation: int | None = Field(default=None, description="Last generation handled.")
    epoch: int = Field(
        default=0, ge=0, description="Increments exactly when routeDigest changes, or when"
                                    " the operator reassigns a Measured route's stages to"
                                    " other nodes."
    )
    route_digest: str | None = Field(
        default=None, description="sha256 over manifestDigest, recipeDigest and stage ranges."
    )
    recipe_digest: str | None = Field(default=None, description="sha256 of pin + recipe.")
    manifest_digest: str | None = Field(default=None, description="The artifact's identity.")
    replicas: int = Field(
        default=0, ge=0, description="Replicas that have stage pods (the scale subresource's"
                                     " status.replicas).")
    ready_replicas: int = Field(
        default=0, ge=0, description="Replicas whose serving pipeline has every stage pod"
                                     " ready (of the current epoch or, mid-rollout, the old).")
    updated_replicas: int = Field(
        default=0, ge=0, description="Replicas served by a ready pipeline of the current"
                                     " epoch.")
    draining: list[str] = Field(
        default_factory=list, description="Pipelines taking no new sessions until they are"
                                          " deleted, e.g. e1/r0 (epoch 1, replica 0).")
    selector: str | None = Field(
        default=None, description="Label selector of the route's stage pods (the scale"
                                  " subresource's, for an HPA).")
    stages: list[StageStatus] = Field(
        default_factory=list, description="Per-stage state of replica 0 (every replica's is"
                                          " in replicaStatuses).")
    stages_ready: str | None = Field(
        default=None, description="Ready stage pods of every replica, e.g. 3/4.")
    replica_statuses: list[ReplicaStatus] = Field(
        default_factory=list, description="Per replica: its stages and whether it is ready.")
    coverage: str | None = Field(
        default=None, description="Layers served out of the model's block count, e.g. 0-30/30."
    )
    capacity: RouteCapacity | None = Field(default=None, description="Capacity summary.")
    endpoint: str | None = Field(
        default=None, description="The gateway's OpenAI base URL in the cluster"
                                  " (http://NAME-gateway.NAMESPACE.svc:PORT/v1).")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded, Certified.",
        json_schema_extra=CONDITIONS_LIST,
    )
    certification: Certificate | None = Field(
        default=None, description="The latest certificate of the route's lane (parity and"
                                  " useful speed against the unsplit reference).")
    tracker: TrackerStatus | None = Field(
        default=None, description="Availability and measured capacity as last reported to"
                                  " the Tracker.")
    exactness: RouteExactness | None = Field(
        default=None, description="What the stages measured to compute exactly and what the"
                                  " route promises from it (absent while no stage answers).")
    speculation: RouteSpeculation | None = Field(
        default=None, description="The acceptance the route's speculation achieves, from its"
                                  " last stage's counters (absent while the route does not"
                                  " speculate and no draft was verified, or that stage does"
                                  " not answer).")
    placement: RoutePlacement | None = Field(
        default=None, description="The measured links between the stages' nodes and the best"
                                  " order of them (spec.placement Measured).")
    compressed_legs: list[str] = Field(
        default_factory=list, description="The legs whose sending stage packs its boundaries"
                                          " (spec.boundaryCompression), as sender->receiver"
                                          " stage names, of replica 0.")


class ShardRoute(ApiModel):
    """A pipeline of layer ranges serving one ModelArtifact with one recipe."""

    api_version: str = Field(default="meshnet.dev/v1alpha1", description="meshnet.dev/v1alpha1.")
    kind: Literal["ShardRoute"] = Field(default="ShardRoute", description="ShardRoute.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Standard metadata.")
    spec: ShardRouteSpec
    status: ShardRouteStatus | None = None
