"""The certification gates, as pure functions of what was measured: parity (the route's
logits against the unsplit reference's), the route's promises (verify windows against
one-row steps, sessions at once against each alone: bit for bit) and useful speed (decode
tokens/s against the reference's)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.api.certification import (
    BatchInvarianceResult,
    Certificate,
    CertificationReason,
    CertifiedLane,
    ParityResult,
    SpeedResult,
    StepInvarianceResult,
)
from meshnet.api.common import Topology


@dataclass(frozen=True)
class PromptLogits:
    """One prompt's compared rows: row i is the distribution after the prompt plus the
    first i reference tokens; `tokens` are the reference's greedy choices."""

    reference: Sequence[np.ndarray]
    route: Sequence[np.ndarray]
    tokens: Sequence[int]


@dataclass(frozen=True)
class Row:
    """One computed row: its logits, and its boundary row at each seam the step crossed
    (the bytes each stage but the last returned for it)."""

    logits: np.ndarray
    seams: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class WindowRows:
    """One prompt's verify window, row by row, and the one-row steps at its positions."""

    window: Sequence[Row]
    single: Sequence[Row]


@dataclass(frozen=True)
class SessionRows:
    """One session's rows when it ran beside others, and its prompt's rows alone."""

    prompt: int
    together: Sequence[np.ndarray]
    alone: Sequence[np.ndarray]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.astype(np.float32).tobytes() == b.astype(np.float32).tobytes()


def _delta(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


class _Tally:
    """Rows compared, rows differing, the largest |delta logit| (None once one is not
    finite) and where rows first differ."""

    def __init__(self) -> None:
        self.compared, self.differing = 0, 0
        self.worst: float | None = 0.0
        self.first: str | None = None

    def add(self, where: str, a: Row, b: Row) -> None:
        self.compared += 1
        delta = _delta(a.logits, b.logits)
        if not math.isfinite(delta):
            self.worst = None
        elif self.worst is not None:
            self.worst = max(self.worst, delta)
        if _bits_equal(a.logits, b.logits) and a.seams == b.seams:
            return
        self.differing += 1
        if self.first is None:
            seam = next((i for i, (x, y) in enumerate(zip(a.seams, b.seams, strict=True))
                         if x != y), None)
            self.first = where + (f": boundary after stage {seam} differs" if seam is not None
                                  else f": |delta logit| {delta:.3g}")


def parity(prompts: Sequence[PromptLogits], tolerance: float) -> ParityResult:
    tally = _Tally()
    mismatch: str | None = None
    for index, prompt in enumerate(prompts):
        for step, (ref, got) in enumerate(zip(prompt.reference, prompt.route, strict=True)):
            tally.add(f"prompt {index} step {step}", Row(ref), Row(got))
            chosen = int(np.argmax(got))
            if mismatch is None and chosen != prompt.tokens[step]:
                mismatch = (f"prompt {index} step {step}: route picks {chosen},"
                            f" the reference {prompt.tokens[step]}")
    steps = max((len(p.tokens) for p in prompts), default=1) - 1
    return ParityResult(prompts=len(prompts), decode_steps=max(steps, 0),
                        max_abs_delta_logit=tally.worst, rows_compared=tally.compared,
                        rows_differing=tally.differing, tolerance=tolerance,
                        exact=tolerance == 0, greedy_match=mismatch is None,
                        first_mismatch=mismatch)


def step_invariance(windows: Sequence[WindowRows], window_rows: int) -> StepInvarianceResult:
    """Bit for bit: a window row against the one-row step at its position."""
    tally = _Tally()
    for index, compared in enumerate(windows):
        for row, (wide, alone) in enumerate(zip(compared.window, compared.single, strict=True)):
            tally.add(f"prompt {index} window row {row}", wide, alone)
    return StepInvarianceResult(window_rows=window_rows, windows=len(windows),
                                rows_compared=tally.compared, rows_differing=tally.differing,
                                max_abs_delta_logit=tally.worst, first_difference=tally.first)


def batch_invariance(sessions: Sequence[SessionRows], together: int) -> BatchInvarianceResult:
    """Bit for bit: each session's rows beside the others against its prompt's rows alone."""
    tally = _Tally()
    for index, session in enumerate(sessions):
        for step, (got, alone) in enumerate(zip(session.together, session.alone, strict=True)):
            tally.add(f"session {index} (prompt {session.prompt}) step {step}", Row(got),
                      Row(alone))
    return BatchInvarianceResult(sessions=together, rows_compared=tally.compared,
                                 rows_differing=tally.differing,
                                 max_abs_delta_logit=tally.worst, first_difference=tally.first)


def speed(route_tps: float, reference_tps: float, required: float,
          topology: str) -> SpeedResult:
    fraction = route_tps / reference_tps if reference_tps > 0 else 0.0
    driven: Topology = "ring" if topology == "ring" else "chain" if topology == "chain" else "hub"
    return SpeedResult(decode_tokens_per_second=round(route_tps, 3),
                       reference_decode_tokens_per_second=round(reference_tps, 3),
                       fraction=round(fraction, 4), required_fraction=required,
                       topology=driven)


def failures(result: ParityResult, pace: SpeedResult,
             steps: StepInvarianceResult | None = None,
             batch: BatchInvarianceResult | None = None
             ) -> list[tuple[CertificationReason, str]]:
    """Every check that did not pass: its code and what was seen, in words."""
    found: list[tuple[CertificationReason, str]] = []
    if result.max_abs_delta_logit is None:
        found.append(("SplitParity", "parity: a logit difference is not finite"))
    elif result.exact and result.rows_differing:
        found.append(("SplitParity", f"parity: {result.rows_differing} of"
                      f" {result.rows_compared} rows are not bit-identical to the unsplit"
                      f" reference's (max |delta logit| {result.max_abs_delta_logit:.6g})"))
    elif result.max_abs_delta_logit > result.tolerance:
        found.append(("SplitParity", f"parity: max |delta logit|"
                      f" {result.max_abs_delta_logit:.6g} exceeds the tolerance"
                      f" {result.tolerance:g}"))
    if not result.greedy_match:
        found.append(("SplitParity", f"parity: greedy tokens differ ({result.first_mismatch})"))
    if steps is not None and (steps.rows_differing or steps.max_abs_delta_logit is None):
        found.append(("StepInvariance", f"step invariance: {steps.rows_differing} of"
                      f" {steps.rows_compared} rows of {steps.window_rows}-row verify windows"
                      f" differ from one-row steps ({steps.first_difference}): speculation"
                      " would change tokens"))
    if batch is not None and (batch.rows_differing or batch.max_abs_delta_logit is None):
        found.append(("BatchInvariance", f"batch invariance: {batch.rows_differing} of"
                      f" {batch.rows_compared} rows of {batch.sessions} sessions at once"
                      f" differ from each alone ({batch.first_difference}): tokens would"
                      " depend on load"))
    if pace.fraction < pace.required_fraction:
        found.append(("Speed", f"speed: {pace.decode_tokens_per_second:.1f} tok/s is"
                      f" {pace.fraction:.2f} of the unsplit"
                      f" {pace.reference_decode_tokens_per_second:.1f} tok/s;"
                      f" {pace.required_fraction:g} is required"))
    return found


def certificate(lane: CertifiedLane, result: ParityResult, pace: SpeedResult, *, stages: int,
                now: str, steps: StepInvarianceResult | None = None,
                batch: BatchInvarianceResult | None = None, route_digest: str | None = None,
                epoch: int | None = None, request: str | None = None) -> Certificate:
    why = failures(result, pace, steps, batch)
    reasons = list(dict.fromkeys(code for code, _ in why))
    return Certificate(lane=lane, passed=not why, certified_at=now,
                       failures=[words for _, words in why], reasons=reasons, parity=result,
                       step_invariance=steps, batch_invariance=batch, speed=pace,
                       stages=stages, route_digest=route_digest, epoch=epoch, request=request)


def figures(certificate: Certificate) -> str:
    """What a certificate measured, in words: each check's max |delta logit| and rows."""
    parity, speed = certificate.parity, certificate.speed
    said = [f"split parity {_worst(parity.max_abs_delta_logit)}"
            + ("" if parity.exact else f" (tolerance {parity.tolerance:g}: not exact)")
            + f" over {parity.rows_compared} rows, greedy"
            f" {'identical' if parity.greedy_match else 'differs'}"]
    if (steps := certificate.step_invariance) is not None:
        said.append(f"{steps.window_rows}-row windows {_worst(steps.max_abs_delta_logit)},"
                    f" {steps.rows_differing} of {steps.rows_compared} rows differ")
    if (batch := certificate.batch_invariance) is not None:
        said.append(f"{batch.sessions} sessions at once {_worst(batch.max_abs_delta_logit)},"
                    f" {batch.rows_differing} of {batch.rows_compared} rows differ")
    said.append(f"decode {speed.decode_tokens_per_second:.1f} tok/s = {speed.fraction:.2f} x"
                f" unsplit {speed.reference_decode_tokens_per_second:.1f}")
    return "; ".join(said)


def _worst(delta: float | None) -> str:
    return "max |delta logit| " + ("non-finite" if delta is None else f"{delta:.3g}")
