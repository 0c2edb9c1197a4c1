"""The acceptance a route's speculation achieves, for its status: the last stage verifies
every draft, so its GetCapacity counters are the route's (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.api.shardroute import Recipe, RouteSpeculation
from meshnet.tracker.inputs import StageSample, StageView


def route_speculation(recipe: Recipe, stages: Sequence[StageView],
                      samples: Mapping[str, StageSample]) -> dict[str, Any] | None:
    """`status.speculation` as observed: the last stage's counters since it started, and
    their ratio. None when that stage did not answer, or when the route does not speculate
    and no draft was ever verified there (nothing to show)."""
    if not stages:
        return None
    sample = samples.get(stages[-1].name)
    capacity = sample.capacity if sample else None
    if capacity is None:
        return None
    verified, accepted = capacity.draft_tokens_verified, capacity.draft_tokens_accepted
    if not verified and not recipe.speculation.enabled:
        return None
    found = RouteSpeculation(
        acceptance=round(accepted / verified, 3) if verified else None,
        draft_tokens_verified=verified, draft_tokens_accepted=accepted)
    return found.model_dump(mode="json", by_alias=True, exclude_none=True)
