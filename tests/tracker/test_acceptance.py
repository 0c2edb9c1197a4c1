"""status.speculation: the acceptance a route's speculation achieves, derived from what its
last stage's GetCapacity said (it verifies every draft), and written only when it changed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from meshnet.api.shardroute import Recipe, ShardRouteStatus
from meshnet.certify.decide import Decision
from meshnet.reconcile.conditions import Verdict
from meshnet.tracker.acceptance import route_speculation
from meshnet.tracker.inputs import StageSample
from meshnet.tracker.planner import Shown, plan_pass

from .conftest import samples, stage_views

LOOKUP = Recipe.model_validate({"speculation": {"mode": "Lookup"}})
NO_CERTIFIER = Decision(Verdict("Certified", False, "NoCertifier",
                                "no certification image for lane cpu"), None)
NOW = "2026-12-04T12:00:00Z"


def counted(verified: int, accepted: int, stage: str = "s2") -> dict[str, StageSample]:
    """Samples of a healthy route whose `stage` counted these drafts (the others none)."""
    found = samples()
    sample = found[stage]
    assert sample.capacity is not None
    found[stage] = replace(sample, capacity=replace(
        sample.capacity, draft_tokens_verified=verified, draft_tokens_accepted=accepted))
    return found


def test_the_acceptance_is_the_last_stages_accepted_over_verified_drafts() -> None:
    assert route_speculation(LOOKUP, stage_views(), counted(736, 655)) == {
        "acceptance": 0.89, "draftTokensVerified": 736, "draftTokensAccepted": 655}


def test_a_speculating_route_with_nothing_verified_yet_shows_its_counters_but_no_acceptance(
) -> None:
    assert route_speculation(LOOKUP, stage_views(), counted(0, 0)) == {
        "draftTokensVerified": 0, "draftTokensAccepted": 0}


def test_a_route_that_does_not_speculate_shows_nothing_unless_drafts_were_verified() -> None:
    assert route_speculation(Recipe(), stage_views(), counted(0, 0)) is None
    # a client that asked for speculation by hand, before the recipe disabled it
    assert route_speculation(Recipe(), stage_views(), counted(8, 2)) == {
        "acceptance": 0.25, "draftTokensVerified": 8, "draftTokensAccepted": 2}


def test_only_the_last_stage_counts_and_without_its_answer_there_is_nothing_to_show() -> None:
    assert route_speculation(LOOKUP, stage_views(), counted(50, 40, stage="s0")) == {
        "draftTokensVerified": 0, "draftTokensAccepted": 0}
    unanswered = counted(50, 40)
    unanswered["s2"] = StageSample("127.0.0.4:5000", error="UNAVAILABLE: connection refused")
    assert route_speculation(LOOKUP, stage_views(), unanswered) is None
    assert route_speculation(LOOKUP, [], {}) is None


def body(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "r1", "generation": 2, "resourceVersion": "41"},
            "status": {"conditions": [{"type": "Certified", "status": "False",
                                       "reason": "NoCertifier", "lastTransitionTime": NOW,
                                       "observedGeneration": 2,
                                       "message": "no certification image for lane cpu"}],
                       **status}}


def test_status_speculation_is_written_when_it_changed_and_removed_once_unobserved() -> None:
    speculation = route_speculation(LOOKUP, stage_views(), counted(736, 655))
    status = shown(body({}), speculation)
    assert status is not None and status["speculation"] == speculation
    assert ShardRouteStatus.model_validate(
        {"speculation": speculation}).speculation is not None  # the CRD's own shape

    written = body({"speculation": speculation})
    assert shown(written, speculation) is None
    status = shown(written, None)
    assert status is not None and "speculation" not in status  # the merge patch removes it


def shown(route: dict[str, Any], speculation: dict[str, Any] | None) -> dict[str, Any] | None:
    """The status a daemon pass writes (None: unchanged) when it shows `speculation`."""
    later = datetime(2026, 12, 4, 13, tzinfo=UTC)
    return plan_pass(route, NO_CERTIFIER, None, Shown(None, None, speculation), later).status
