"""What one generation produced, with its timings: the driver's answer and the JSON of
`meshnet generate --json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Generation:
    """What one `generate` call produced, with its timings."""

    session_id: str
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "max_tokens"  # max_tokens | eos | context
    topology: str = "hub"  # hub | chain | ring
    decode_loop: bool = False  # the first stage drove the decode (ForwardStream)
    prefill_wavefront: bool = False  # a prefill's chunks were pipelined through the stages
    recoveries: int = 0
    recovery_reasons: list[str] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Engine time of the decode steps, summed over the stages (the stages' own account,
    # from each answer's chain trace): the rest of decode_seconds went to the network,
    # the hand-offs between threads and the driver.
    decode_engine_seconds: float = 0.0
    boundary_bytes: int = 0
    # Speculative decoding (Session.verified, or in a loop): the longest draft (0: off), the
    # draft tokens verified, those accepted, and the steps that carried a draft.
    speculate: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    speculative_steps: int = 0
    # Why it speculated less than asked (meshnet.route.exactness: no_discard, not_exact; ""
    # when as asked), and the same in words naming the stage.
    speculation_limit: str = ""
    speculation_reason: str = ""
    # Some stage batches as upstream does (--batching throughput): these tokens may depend
    # on what else the route ran.
    load_dependent: bool = False
    rejected_steps: int = 0  # of them, those where a draft did not hold
    # Pipelined speculation in a decode loop: the verify windows it could keep in flight,
    # and the most it did (ForwardResponse.loop_depth).
    windows: int = 1
    loop_depth: int = 0
    # Prompt tokens every stage copied from a cached prefix instead of computing them
    # (OpenAI's usage.prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def token_acceptance(self) -> float:
        """The chance a draft holds given those before it in its step held: the drafts
        accepted over those and each step's first failing one (acceptance_rate also counts
        the drafts checked after a failure, which cannot hold)."""
        checked = self.accepted_draft_tokens + self.rejected_steps
        return self.accepted_draft_tokens / checked if checked else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_tokens) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first token comes out of the prefill; each later one costs one decode step.
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["prefill_tokens_per_second"] = round(self.prefill_tokens_per_second, 2)
        data["decode_tokens_per_second"] = round(self.decode_tokens_per_second, 2)
        data["acceptance_rate"] = round(self.acceptance_rate, 4)
        data["token_acceptance"] = round(self.token_acceptance, 4)
        return data
