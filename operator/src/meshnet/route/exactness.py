"""How far a route may speculate without changing a token (pure).

A verify window of `drafts` drafts is a step of drafts + 1 rows through every stage; its
rows equal one-token decode steps only within the widest step each stage measured at start
to compute exactly (GetInfo exact_step_rows, docs/architecture.md "Exactness on every
lane"). So a route speculates with at most the narrowest stage's exact step less one
drafts, and decodes plainly where that is none; the reason is always said, never a token
silently computed inexactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.route.handshake import RouteInfo

# Why a route speculates less than asked (Generation.speculation_limit, the gateway's
# meshnet_speculation_limited_total{reason}): a fixed set.
NO_DISCARD = "no_discard"  # a stage cannot drop rejected drafts
NOT_EXACT = "not_exact"  # a stage's exact step is narrower than the window asked for
LIMITS = (NO_DISCARD, NOT_EXACT)


@dataclass(frozen=True)
class SpeculationPlan:
    """The drafts per window a session runs with, and why fewer than asked."""

    drafts: int
    limit: str = ""  # one of LIMITS, "" when as asked
    reason: str = ""  # the same in words, naming the stage

    @property
    def plain(self) -> bool:
        return self.drafts == 0


def plan_speculation(asked: int, route: RouteInfo) -> SpeculationPlan:
    """At most `asked` drafts per window, within what every stage of `route` computes
    exactly."""
    if asked <= 0:
        return SpeculationPlan(0)
    if not route.can_discard:
        return SpeculationPlan(0, NO_DISCARD, "plain decoding: a stage cannot drop rejected "
                                              "drafts (can_discard is false)")
    narrowest = route.narrowest_exact_stage
    rows = route.exact_step_rows
    if narrowest is None or rows >= asked + 1:
        return SpeculationPlan(asked)
    drafts = max(0, rows - 1)
    what = (f"stage {narrowest.endpoint} (layers {narrowest.begin}:{narrowest.end}) measured "
            f"exact steps of at most {rows} row{'s' if rows != 1 else ''}, a window of "
            f"{asked} draft{'s' if asked != 1 else ''} is {asked + 1}")
    if narrowest.exactness_detail:
        what += f" ({narrowest.exactness_detail})"
    if drafts == 0:
        return SpeculationPlan(0, NOT_EXACT, f"plain decoding: {what}")
    return SpeculationPlan(drafts, NOT_EXACT, f"speculation capped at {drafts} drafts: {what}")
