"""recipe.speculation: its defaults, the worker settings it stands for, and why it stays out
of recipeDigest (the tokens are those of plain decoding)."""

from __future__ import annotations

from typing import get_args

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.modelartifact import GgufDrafter
from meshnet.api.shardroute import MAX_DRAFTS, MAX_WINDOWS, Recipe, Speculation, SpeculationMode
from meshnet.digests import recipe_digest
from meshnet.route import drafts


def test_by_default_a_route_does_not_speculate_and_would_draft_6_in_4_windows() -> None:
    speculation = Recipe().speculation
    assert (speculation.mode, speculation.max_drafts, speculation.max_windows) == (
        "Disabled", 6, 4)
    assert not speculation.enabled
    assert Recipe.model_validate({"speculation": {"mode": "Lookup"}}).speculation == Speculation(
        mode="Lookup", max_drafts=6, max_windows=4)


def test_the_recipe_bounds_are_the_route_drivers_and_the_workers() -> None:
    assert (MAX_DRAFTS, MAX_WINDOWS) == (drafts.MAX_DRAFT, drafts.MAX_WINDOWS)


def test_a_disabled_mode_lets_no_loop_draft_and_keeps_no_rollback_depth() -> None:
    disabled = Speculation(max_drafts=7, max_windows=8)
    assert (disabled.loop_drafts(), disabled.loop_windows(), disabled.discard_depth()) == (
        0, 1, 0)


def test_one_rejection_may_drop_every_window_in_flight_each_a_token_and_its_drafts() -> None:
    assert Speculation(mode="Lookup").discard_depth() == 4 * (6 + 1) - 1
    assert Speculation(mode="Lookup", max_drafts=1, max_windows=1).discard_depth() == 1
    widest = Speculation(mode="Lookup", max_drafts=7, max_windows=8)
    assert (widest.loop_drafts(), widest.loop_windows(), widest.discard_depth()) == (7, 8, 63)


def test_speculation_is_not_part_of_the_recipe_digest() -> None:
    plain = Recipe()
    speculating = Recipe.model_validate(
        {"speculation": {"mode": "Lookup", "maxDrafts": 7, "maxWindows": 8}})
    assert "speculation" not in plain.identity()
    assert recipe_digest("p" * 64, plain.identity()) == recipe_digest(
        "p" * 64, speculating.identity())
    assert recipe_digest("p" * 64, plain.identity()) != recipe_digest(
        "p" * 64, Recipe(context_length=2048).identity())


def test_each_drafter_kind_is_one_mode_and_one_artifact_drafter_as_the_crds_spell_it() -> None:
    """The CRDs keep their values (MTP, DSpark); the worker's names (mtp, dspark) are the
    kinds' own; the modes that draft without a stage drafter map to none."""
    modes = get_args(SpeculationMode)
    assert {mode: Speculation(mode=mode).stage_drafter() for mode in modes} == {
        "Disabled": None, "Lookup": None, "MTP": DrafterKind.MTP, "DSpark": DrafterKind.DSPARK}
    assert get_args(GgufDrafter.model_fields["kind"].annotation) == tuple(
        kind.api_name for kind in DrafterKind) == ("MTP", "DSpark")
    assert [kind.value for kind in DrafterKind] == ["mtp", "dspark"]
    for kind in DrafterKind:
        assert DrafterKind.from_api(kind.api_name) is DrafterKind.from_worker(kind.value) is kind
    assert DrafterKind.from_worker("") is DrafterKind.from_worker("eagle") is None
    assert DrafterKind.from_api("mtp") is DrafterKind.from_worker("MTP") is None  # not mixed up
