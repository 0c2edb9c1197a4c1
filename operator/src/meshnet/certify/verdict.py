"""The certification gates, as pure functions of what was measured: parity (the route's
logits against the unsplit reference's) and useful speed (decode tokens/s against it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.api.certification import (
    Certificate,
    CertifiedLane,
    ParityResult,
    SpeedResult,
)
from meshnet.api.common import Topology


@dataclass(frozen=True)
class PromptLogits:
    """One prompt's compared rows: row i is the distribution after the prompt plus the
    first i reference tokens; `tokens` are the reference's greedy choices."""

    reference: Sequence[np.ndarray]
    route: Sequence[np.ndarray]
    tokens: Sequence[int]


def parity(prompts: Sequence[PromptLogits], tolerance: float) -> ParityResult:
    worst: float | None = 0.0
    mismatch: str | None = None
    for index, prompt in enumerate(prompts):
        for step, (ref, got) in enumerate(zip(prompt.reference, prompt.route, strict=True)):
            delta = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
            if not math.isfinite(delta):
                worst = None
            elif worst is not None:
                worst = max(worst, delta)
            chosen = int(np.argmax(got))
            if mismatch is None and chosen != prompt.tokens[step]:
                mismatch = (f"prompt {index} step {step}: route picks {chosen},"
                            f" the reference {prompt.tokens[step]}")
    steps = max((len(p.tokens) for p in prompts), default=1) - 1
    return ParityResult(prompts=len(prompts), decode_steps=max(steps, 0),
                        max_abs_delta_logit=worst, tolerance=tolerance,
                        greedy_match=mismatch is None, first_mismatch=mismatch)


def speed(route_tps: float, reference_tps: float, required: float,
          topology: str) -> SpeedResult:
    fraction = route_tps / reference_tps if reference_tps > 0 else 0.0
    driven: Topology = "ring" if topology == "ring" else "chain" if topology == "chain" else "hub"
    return SpeedResult(decode_tokens_per_second=round(route_tps, 3),
                       reference_decode_tokens_per_second=round(reference_tps, 3),
                       fraction=round(fraction, 4), required_fraction=required,
                       topology=driven)


def failures(result: ParityResult, pace: SpeedResult) -> list[str]:
    """Every gate that did not pass, in words."""
    found = []
    if result.max_abs_delta_logit is None:
        found.append("parity: a logit difference is not finite")
    elif result.max_abs_delta_logit > result.tolerance:
        found.append(f"parity: max |delta logit| {result.max_abs_delta_logit:.6g} exceeds the"
                     f" tolerance {result.tolerance:g}")
    if not result.greedy_match:
        found.append(f"parity: greedy tokens differ ({result.first_mismatch})")
    if pace.fraction < pace.required_fraction:
        found.append(f"speed: {pace.decode_tokens_per_second:.1f} tok/s is {pace.fraction:.2f}"
                     f" of the unsplit {pace.reference_decode_tokens_per_second:.1f} tok/s;"
                     f" {pace.required_fraction:g} is required")
    return found


def certificate(lane: CertifiedLane, result: ParityResult, pace: SpeedResult, *, stages: int,
                now: str, route_digest: str | None = None, epoch: int | None = None,
                request: str | None = None) -> Certificate:
    why = failures(result, pace)
    return Certificate(lane=lane, passed=not why, certified_at=now, failures=why, parity=result,
                       speed=pace, stages=stages, route_digest=route_digest, epoch=epoch,
                       request=request)
