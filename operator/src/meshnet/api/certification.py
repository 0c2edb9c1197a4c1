"""Certification of a lane: the record `meshnet certify` produces, a ShardRoute keeps in
`status.certification` and every Tracker report carries (only certified lanes are ever
advertised, docs/architecture.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshnet.api.common import ApiModel, Batching, Topology
from meshnet.digests import canonical_digest

Backend = Literal["cpu", "cuda", "rocm", "vulkan"]
Digest = str  # sha256, 64 lower-case hex digits (pattern in the fields below)
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
NO_GPU = "none"  # the GPU product of the cpu lane
# The most rows a certified verify window may have: the most tokens a stage takes in one
# step (the worker's --batch as the operator leaves it).
MAX_WINDOW_ROWS = 512
# Why a certificate did not pass, one code per failed check (docs/certification.md).
CertificationReason = Literal["SplitParity", "StepInvariance", "BatchInvariance", "Speed"]


class CertifiedLane(ApiModel):
    """What a certificate is valid for: one backend, GPU product, artifact and recipe."""

    backend: Backend = Field(description="Backend lane: cpu, cuda, rocm or vulkan.")
    gpu_product: str = Field(
        min_length=1, max_length=256,
        description="GPU product from the stage nodes' labels (e.g. nvidia.com/gpu.product);"
                    " 'none' on the cpu lane; several products joined with '+'.",
    )
    manifest_digest: Digest = Field(pattern=DIGEST_PATTERN, description="Artifact identity.")
    recipe_digest: Digest = Field(pattern=DIGEST_PATTERN, description="Recipe identity.")
    # What the route promises beyond a plain split, each checked on the lane's hardware: a
    # certificate is valid only for the promises it checked (a route that starts to
    # speculate, or batches more sessions, is certified anew).
    verify_rows: int = Field(
        default=1, ge=1, le=MAX_WINDOW_ROWS,
        description="Rows of the route's verify windows: speculation.maxDrafts + 1 when it"
                    " speculates (each window must compute as that many one-row steps);"
                    " 1 when it does not.")
    sessions: int = Field(
        default=1, ge=1, le=1024,
        description="Sessions the route runs at once (recipe.sessionSlots): above 1 each must"
                    " compute as alone.")
    batching: Batching = Field(
        default="Exact",
        description="recipe.batching. Throughput: stages batch sessions as upstream does, so"
                    " a session's tokens may depend on the load; nothing is promised, nor"
                    " checked, of sessions at once.")

    def key(self) -> str:
        """A stable digest naming this lane (certificate files, Job names)."""
        return canonical_digest(self.model_dump(by_alias=True))

    def describe(self) -> str:
        promises = (f", windows of {self.verify_rows} rows" if self.verify_rows > 1 else "") + (
            ", batching Throughput (tokens may depend on the load)" if self.load_dependent
            else f", {self.sessions} sessions at once" if self.sessions > 1 else "")
        return (f"{self.backend}/{self.gpu_product} manifest {self.manifest_digest[:12]}"
                f" recipe {self.recipe_digest[:12]}{promises}")

    @property
    def load_dependent(self) -> bool:
        """Whether a session's tokens may depend on the sessions beside it."""
        return self.batching == "Throughput" and self.sessions > 1

    def differences(self, other: CertifiedLane) -> list[str]:
        """The fields in which `other` differs from this lane, as 'field a -> b'."""
        mine, theirs = self.model_dump(by_alias=True), other.model_dump(by_alias=True)
        return [f"{key} {str(theirs[key])[:12]} -> {str(mine[key])[:12]}"
                for key in mine if mine[key] != theirs[key]]


class ParityResult(ApiModel):
    """The route's logits against the unsplit reference's on the fixed prompt set."""

    # Teacher-forced: both sides are fed the reference's greedy tokens, so every row
    # compares the same context even after the route would have chosen differently.

    prompts: int = Field(ge=1, description="Prompts in the fixed set.")
    decode_steps: int = Field(ge=0, description="Greedy steps compared per prompt.")
    max_abs_delta_logit: float | None = Field(
        default=None, ge=0,
        description="Largest |route logit - reference logit| over every compared row"
                    " (null: a non-finite difference).")
    rows_compared: int = Field(ge=0, description="Logit rows compared.")
    rows_differing: int = Field(ge=0, description="Rows not bit-identical to the reference's.")
    tolerance: float = Field(ge=0, description="Largest |delta logit| that passes.")
    exact: bool = Field(description="The gate demanded bit-identical logits (tolerance 0);"
                                    " false: a looser tolerance was set explicitly.")
    greedy_match: bool = Field(description="The route's argmax equals the reference's token"
                                           " at every compared step.")
    first_mismatch: str | None = Field(default=None,
                                       description="Where the greedy tokens first differ.")


class StepInvarianceResult(ApiModel):
    """Verify windows against one-row steps at the same positions, on the route itself:
    speculation changes no token only where they compute the same bits."""

    window_rows: int = Field(ge=1, description="Rows per window (speculation.maxDrafts + 1).")
    windows: int = Field(ge=0, description="Windows compared (one after each prompt).")
    rows_compared: int = Field(ge=0, description="Window rows compared.")
    rows_differing: int = Field(
        ge=0, description="Rows whose logits, or boundary at any seam, are not bit-identical"
                          " to the one-row step's.")
    max_abs_delta_logit: float | None = Field(
        default=None, ge=0, description="Largest |window logit - one-row logit| (null: a"
                                        " non-finite difference).")
    first_difference: str | None = Field(default=None, description="Where rows first differ.")


class BatchInvarianceResult(ApiModel):
    """Sessions run at once against each run alone, on the route itself: a session's
    tokens must not depend on what else the stages compute."""

    sessions: int = Field(ge=1, description="Sessions run at once (recipe.sessionSlots).")
    rows_compared: int = Field(ge=0, description="Logit rows compared.")
    rows_differing: int = Field(ge=0, description="Rows not bit-identical to the session's"
                                                  " rows alone.")
    max_abs_delta_logit: float | None = Field(
        default=None, ge=0, description="Largest |together logit - alone logit| (null: a"
                                        " non-finite difference).")
    first_difference: str | None = Field(default=None, description="Where rows first differ.")


class SpeedResult(ApiModel):
    """The useful-speed gate: the route's greedy decode against the unsplit reference's."""

    decode_tokens_per_second: float = Field(ge=0, description="The route's decode tokens/s.")
    reference_decode_tokens_per_second: float = Field(
        ge=0, description="The unsplit reference's decode tokens/s.")
    fraction: float = Field(ge=0, description="Route / reference.")
    required_fraction: float = Field(ge=0, description="The fraction the gate requires.")
    topology: Topology = Field(description="How the route was driven.")


class Certificate(ApiModel):
    """One certification run of one lane: the verdict and the figures it rests on."""

    lane: CertifiedLane = Field(description="The lane this certificate is for.")
    passed: bool = Field(description="Every check passed: split parity, speed, and the"
                                     " lane's promises (step and batch invariance).")
    certified_at: str = Field(description="When the run finished (RFC 3339, UTC).")
    failures: list[str] = Field(
        default_factory=list, description="Why it did not pass (empty when it passed).")
    reasons: list[CertificationReason] = Field(
        default_factory=list, description="The checks that failed, as codes: SplitParity,"
                                          " StepInvariance, BatchInvariance, Speed.")
    parity: ParityResult = Field(description="Against the unsplit reference's logits.")
    step_invariance: StepInvarianceResult | None = Field(
        default=None, description="Verify windows against one-row steps (null: the lane"
                                  " promises no speculation).")
    batch_invariance: BatchInvarianceResult | None = Field(
        default=None, description="Sessions at once against each alone (null: the lane"
                                  " promises one session at a time).")
    speed: SpeedResult = Field(description="Against the unsplit reference's decode speed.")
    stages: int = Field(ge=1, description="Stages of the route that was certified.")
    route_digest: str | None = Field(default=None, description="The route certified.")
    epoch: int | None = Field(default=None, ge=0, description="Its epoch at the time.")
    request: str | None = Field(
        default=None, max_length=253,
        description="The meshnet.dev/recertify annotation value this run answered.")

    def valid_for(self, lane: CertifiedLane) -> bool:
        """A passing certificate of exactly this lane."""
        return self.passed and self.lane == lane
