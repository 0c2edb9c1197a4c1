"""status.exactness: what the route's stages measured at start to compute exactly (GetInfo
exact_step_rows, exact_batching) and what the route promises from it - written by the
tracker pass, the one writer of that status key."""

from __future__ import annotations

from dataclasses import replace

from meshnet.api.shardroute import Recipe
from meshnet.tracker.exactness import route_exactness
from meshnet.tracker.inputs import StageSample

from .conftest import samples, stage_views

LOOKUP = Recipe.model_validate({"speculation": {"mode": "Lookup", "maxDrafts": 7}})


def measured(stage: str, rows: int, batching: bool) -> dict[str, StageSample]:
    found = samples()
    info = found[stage].info
    assert info is not None
    found[stage] = replace(found[stage], info=replace(info, exact_step_rows=rows,
                                                      exact_batching=batching))
    return found


def test_stages_that_measured_exact_steps_promise_load_invariant_tokens() -> None:
    shown = route_exactness(LOOKUP, stage_views(), samples())
    assert shown is not None
    assert (shown["batching"], shown["loadDependent"], shown["exactStepRows"],
            shown["exactBatching"]) == ("Exact", False, 8, True)
    assert "speculationLimit" not in shown


def test_a_stage_below_the_verify_window_is_named_as_the_limit_of_speculation() -> None:
    shown = route_exactness(LOOKUP, stage_views(), measured("s1", 1, False))
    assert shown is not None
    assert (shown["exactStepRows"], shown["exactBatching"]) == (1, False)
    assert shown["speculationLimit"] == "NotExact"
    assert "decodes plainly, no speculation: stage s1 measured exact steps of at most 1 rows" \
        in shown["message"]
    assert "stage s1: sessions' rows do not compute as alone" in shown["message"]
    capped = route_exactness(LOOKUP, stage_views(), measured("s2", 4, True))
    assert capped is not None and "speculates with at most 3 drafts: stage s2" in capped["message"]


def test_a_throughput_route_says_its_tokens_may_depend_on_the_load() -> None:
    recipe = Recipe.model_validate({"batching": "Throughput"})
    shown = route_exactness(recipe, stage_views(), measured("s1", 8, False))
    assert shown is not None
    assert shown["batching"] == "Throughput" and shown["loadDependent"] is True
    assert "a session's tokens may depend on the load" in shown["message"]
    # throughput batching enters the recipe's identity: its tokens are other numerics
    assert Recipe().identity() != recipe.identity()
    assert "batching" not in Recipe().identity()  # an Exact route's digest is unchanged


def test_nothing_is_shown_while_no_stage_answered() -> None:
    assert route_exactness(LOOKUP, stage_views(), {}) is None
