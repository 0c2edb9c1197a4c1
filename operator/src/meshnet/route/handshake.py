"""The route handshake: GetInfo from every stage, checked as one route (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.api.drafter_kind import DrafterKind
from meshnet.route.compression import BoundaryCompression
from meshnet.route.errors import RouteRefused
from meshnet.route.proto import pb

PROTOCOL = "meshnet.shard.v1"

# Architectures whose logits depend on where a prompt's steps begin and end, not only on
# the tokens: deepseek4's compressed attention, whose compressed rows are built per step
# (BENCHMARKS.md, route driver measurements).
STEP_SENSITIVE_ARCHITECTURES = frozenset({"deepseek4"})


@dataclass(frozen=True)
class StageInfo:
    endpoint: str
    begin: int
    end: int
    incarnation: str
    has_vocab: bool
    needs_token_sideband: bool
    next_stage: str = ""
    # A first stage's back edge (--ring-last): the last stage's incarnation while it is
    # subscribed there ("" when it is not, or has none).
    ring_last_incarnation: str = ""
    # Where it computes (GetInfo's placement): host boot id, CPUs, threads, GPU layers.
    host_id: str = ""
    cpus: tuple[int, ...] = ()
    threads: int = 0
    gpu_layers: int = 0
    # What it measured at start to compute exactly (GetInfo exact_step_rows, exact_batching,
    # exactness_detail), and whether it batches as upstream (--batching throughput).
    exact_step_rows: int = 0
    exact_batching: bool = False
    exactness_detail: str = ""
    throughput_batching: bool = False
    # The boundary encodings it takes (GetInfo boundary_encodings; empty: raw only).
    boundary_encodings: tuple[int, ...] = ()


@dataclass(frozen=True)
class RouteInfo:
    route_id: str
    epoch: int
    manifest_digest: str
    recipe_digest: str
    route_digest: str
    architecture: str
    n_layer: int
    n_vocab: int
    n_ctx: int              # the smallest stage's
    max_step_tokens: int    # the smallest stage's
    eos_token_ids: tuple[int, ...]
    boundary_schema: int
    boundary_dtype: int
    boundary_row_shape: tuple[int, ...]
    stages: tuple[StageInfo, ...]
    n_slots: int = 0  # sessions at once: the smallest stage's
    chat_template: str = ""  # the model's (GGUF tokenizer.chat_template), "" when none
    can_discard: bool = False  # every stage can drop rejected drafts (speculation)
    # Positions one discard may drop on every stage (0: any; deepseek4's rollback snapshots).
    discard_depth: int = 0
    drafter: DrafterKind | None = None  # the last stage's drafter, None when it hosts none
    # Prefix cache block (GetInfo prefix_block) when every stage has the same and a step may
    # be that wide (max_step_tokens), else 0 (off):
    # prefills are cut on this grid and a session may start from a cached prefix.
    prefix_block: int = 0
    # What the driver's own legs (the hub's: a stage's answer to the driver, the driver's
    # request to the next stage) do to boundaries where the stage takes it and is not on
    # loopback (meshnet.route.compression); the driver's setting, not the stages'.
    boundary_compression: BoundaryCompression = BoundaryCompression.OFF

    @property
    def chained(self) -> bool:
        """Every stage but the last relays to a next stage (chain topology possible)."""
        return all(stage.next_stage for stage in self.stages[:-1])

    @property
    def ringed(self) -> bool:
        """A chain whose first stage receives the last stage's tokens straight (Ring): the
        back edge's incarnation is the route's own last stage's, not any other worker's."""
        return (len(self.stages) > 1 and self.chained
                and self.stages[0].ring_last_incarnation == self.stages[-1].incarnation)

    @property
    def stages_take_turns(self) -> bool:
        """Every stage computes on one host's CPUs, each with threads enough to keep all
        of those CPUs busy: two stages computing at once would only contend, so a prefill
        goes chunk after chunk rather than as a wavefront. False when any stage's
        placement is unknown or it offloads layers to a GPU."""
        hosts = {stage.host_id for stage in self.stages}
        if len(self.stages) < 2 or len(hosts) != 1 or "" in hosts:
            return False
        cpus = set().union(*(stage.cpus for stage in self.stages))
        return bool(cpus) and all(
            stage.gpu_layers == 0 and stage.threads >= len(cpus) for stage in self.stages)

    @property
    def step_sensitive(self) -> bool:
        """Steps of other sizes would compute other logits: a prompt goes in the largest
        steps, as the unsplit model takes it, and a recovery replays the steps as fed."""
        return self.architecture in STEP_SENSITIVE_ARCHITECTURES

    @property
    def exact_step_rows(self) -> int:
        """The widest step every stage measured to compute as one-row steps (0: none): a
        verify window of drafts + 1 rows is exact only within it."""
        return min((stage.exact_step_rows for stage in self.stages), default=0)

    @property
    def narrowest_exact_stage(self) -> StageInfo | None:
        """The stage whose exact step is the narrowest (None without stages)."""
        return min(self.stages, key=lambda stage: stage.exact_step_rows, default=None)

    @property
    def load_dependent(self) -> bool:
        """Some stage batches as upstream does (--batching throughput): a session's tokens
        may depend on what else the route runs."""
        return any(stage.throughput_batching for stage in self.stages)

    @property
    def seam_bytes_per_token(self) -> int:
        """Boundary payload bytes per token per seam (dtype size x row elements)."""
        size = 4 if self.boundary_dtype == pb.BOUNDARY_DTYPE_F32 else 2
        row = 1
        for dim in self.boundary_row_shape:
            row *= dim
        return size * row


def check_route(answers: Sequence[tuple[str, pb.GetInfoResponse]],
                drafter: DrafterKind | None = None) -> RouteInfo:
    """The route the stages describe, in order; RouteRefused lists every problem.
    `drafter`: the drafter the route's last stage must host, None for none."""
    if not answers:
        raise RouteRefused(["a route needs at least one stage"])
    problems: list[str] = []
    first = answers[0][1]

    def same(field: str, label: str) -> None:
        values = {getattr(info, field) for _, info in answers}
        if len(values) > 1:
            detail = ", ".join(f"{ep}={getattr(info, field)!r}" for ep, info in answers)
            problems.append(f"stages disagree on {label}: {detail}")

    for endpoint, info in answers:
        if info.protocol != PROTOCOL:
            problems.append(f"{endpoint} speaks {info.protocol!r}, not {PROTOCOL}")
    same("route_id", "the route id")
    same("epoch", "the epoch (a route change is rolling out: retry)")
    same("manifest_digest", "the artifact (manifest digest)")
    same("recipe_digest", "the recipe (recipe digest)")
    same("route_digest", "the route digest")
    same("architecture", "the architecture")
    same("n_layer", "the layer count")
    same("n_vocab", "the vocabulary size")

    expected_begin = 0
    for endpoint, info in answers:
        begin, end = info.layers.begin, info.layers.end
        if begin != expected_begin:
            what = "a gap" if begin > expected_begin else "an overlap"
            problems.append(
                f"{endpoint} owns layers {begin}:{end}, but the route needs a stage starting "
                f"at layer {expected_begin} there ({what})"
            )
        expected_begin = end
    if expected_begin != first.n_layer:
        problems.append(
            f"the stages cover layers 0:{expected_begin}, not all {first.n_layer} layers"
        )

    specs = {
        (e.boundary.schema, e.boundary.dtype, tuple(e.boundary.row_shape)) for _, e in answers[1:]
    } | {(first.boundary.schema, first.boundary.dtype, tuple(first.boundary.row_shape))}
    if len(specs) > 1:
        detail = ", ".join(
            f"{ep}={pb.BoundarySchema.Name(i.boundary.schema)}/"
            f"{pb.BoundaryDtype.Name(i.boundary.dtype)}{list(i.boundary.row_shape)}"
            for ep, i in answers
        )
        problems.append(f"stages disagree on the boundary: {detail}")
    if not any(info.has_vocab for _, info in answers):
        problems.append("no stage can tokenize (has_vocab is false everywhere)")
    if problems:
        raise RouteRefused(problems)
    last_endpoint, last = answers[-1]
    named = last.drafter.kind if last.HasField("drafter") else ""
    hosted = DrafterKind.from_worker(named)
    if drafter is not None and hosted is not drafter:
        raise RouteRefused([f"the route drafts with {drafter.value}, but its last stage "
                            f"{last_endpoint} hosts {named or 'no drafter'} (started without"
                            f" --drafter {drafter.value})"], reason="DrafterMissing")

    return RouteInfo(
        route_id=first.route_id,
        epoch=first.epoch,
        manifest_digest=first.manifest_digest,
        recipe_digest=first.recipe_digest,
        route_digest=first.route_digest,
        architecture=first.architecture,
        n_layer=first.n_layer,
        n_vocab=first.n_vocab,
        n_ctx=min(info.n_ctx for _, info in answers),
        max_step_tokens=min(info.max_step_tokens for _, info in answers),
        eos_token_ids=tuple(first.eos_token_ids),
        n_slots=min(info.n_slots for _, info in answers),
        chat_template=next((i.chat_template for _, i in answers if i.chat_template), ""),
        can_discard=all(info.can_discard for _, info in answers),
        discard_depth=min((info.discard_depth for _, info in answers if info.discard_depth > 0),
                          default=0),
        drafter=hosted,
        prefix_block=common_prefix_block([info.prefix_block for _, info in answers],
                                         min(info.max_step_tokens for _, info in answers)),
        boundary_schema=first.boundary.schema,
        boundary_dtype=first.boundary.dtype,
        boundary_row_shape=tuple(first.boundary.row_shape),
        stages=tuple(
            StageInfo(
                endpoint=endpoint,
                begin=info.layers.begin,
                end=info.layers.end,
                incarnation=info.incarnation,
                has_vocab=info.has_vocab,
                needs_token_sideband=info.boundary.needs_token_sideband,
                next_stage=info.next_stage,
                ring_last_incarnation=info.ring_last_incarnation,
                host_id=info.placement.host_id,
                cpus=tuple(info.placement.cpus),
                threads=info.placement.threads,
                gpu_layers=info.placement.gpu_layers,
                exact_step_rows=info.exact_step_rows,
                exact_batching=info.exact_batching,
                exactness_detail=info.exactness_detail,
                throughput_batching=info.throughput_batching,
                boundary_encodings=tuple(info.boundary_encodings),
            )
            for endpoint, info in answers
        ),
    )


def common_prefix_block(blocks: Sequence[int], max_step_tokens: int) -> int:
    """The prefix cache's block when every stage has the same one, else 0: a prefix is only
    reusable where all stages hold it on the same grid. Also 0 for a block wider than a
    step may be (`max_step_tokens`, the smallest stage's): a stage records a block only
    when one step carries it whole, so no block could ever be cached, and steps of a whole
    block would be refused (STEP_TOO_LARGE); such a route cuts its prefills as one without
    the cache does."""
    if not blocks or len(set(blocks)) != 1 or blocks[0] > max_step_tokens:
        return 0
    return blocks[0]
