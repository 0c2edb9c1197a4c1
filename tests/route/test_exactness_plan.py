"""The driver's rule for speculation (meshnet.route.exactness, pure): a verify window of
drafts + 1 rows only within the widest step every stage measured to compute exactly; fewer
drafts, or plain decoding, where a stage measured less, always with the reason naming it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from meshnet.route.exactness import NO_DISCARD, NOT_EXACT, SpeculationPlan, plan_speculation
from meshnet.route.handshake import RouteInfo


def narrowed(route: RouteInfo, stage: int, rows: int) -> RouteInfo:
    stages = list(route.stages)
    stages[stage] = replace(stages[stage], exact_step_rows=rows,
                            exactness_detail=f"steps of 1..{rows} rows")
    return replace(route, stages=tuple(stages))


def test_a_route_whose_stages_measured_8_exact_rows_speculates_as_asked(
        make_route_info: Callable[..., RouteInfo]) -> None:
    route = make_route_info(can_discard=True)
    assert route.exact_step_rows == 8
    assert plan_speculation(7, route) == SpeculationPlan(7)
    assert plan_speculation(0, route) == SpeculationPlan(0)


def test_one_stage_below_the_window_caps_the_drafts_to_its_exact_step(
        make_route_info: Callable[..., RouteInfo]) -> None:
    route = narrowed(make_route_info(can_discard=True), 1, 4)
    plan = plan_speculation(7, route)
    assert (plan.drafts, plan.limit) == (3, NOT_EXACT)
    assert plan.reason.startswith("speculation capped at 3 drafts: stage 127.0.0.1:7002 "
                                  "(layers 10:20) measured exact steps of at most 4 rows")
    assert plan_speculation(3, route) == SpeculationPlan(3)  # a window of 4 is covered


def test_a_stage_with_no_exact_multi_row_step_refuses_speculation_with_the_reason(
        make_route_info: Callable[..., RouteInfo]) -> None:
    for rows in (0, 1):
        plan = plan_speculation(7, narrowed(make_route_info(can_discard=True), 2, rows))
        assert plan.plain and plan.limit == NOT_EXACT
        assert plan.reason.startswith("plain decoding: stage 127.0.0.1:7003 (layers 20:30) "
                                      f"measured exact steps of at most {rows} row")


def test_a_route_that_cannot_discard_decodes_plainly_and_says_so(
        make_route_info: Callable[..., RouteInfo]) -> None:
    plan = plan_speculation(4, make_route_info(can_discard=False))
    assert plan.plain and plan.limit == NO_DISCARD
