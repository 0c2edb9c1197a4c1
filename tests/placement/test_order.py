"""Placement orders a route's machines by the measured links: a slow leg is left out of the
cycle, bandwidth matters for the rows and not for the tokens, the gateway goes next to the
first stage, and a link not measured is refused by name."""

from __future__ import annotations

import itertools

import pytest

from meshnet.placement.order import MeasuredLink, PlacementError, cycle, place

FAST = MeasuredLink(rtt_s=0.002, bytes_per_s=125e6)  # 1 ms one way, 1 Gbit/s
V4_ROW = 4 * 4096 * 4  # a DeepSeek V4 boundary row in f32


def mesh(machines: list[str], **planted: MeasuredLink) -> dict[tuple[str, str], MeasuredLink]:
    """Every directed link FAST, except those planted as from_to=link."""
    links = {(a, b): FAST for a, b in itertools.permutations(machines, 2)}
    for name, link in planted.items():
        a, b = name.split("_")
        links[a, b] = link
    return links


def test_a_ring_is_ordered_around_a_slow_leg() -> None:
    machines = ["a", "b", "c", "d"]
    slow = MeasuredLink(rtt_s=0.100, bytes_per_s=125e6)
    links = mesh(machines, a_b=slow, b_a=slow)  # a and b are 50 ms apart, both ways

    best = place(machines, links, V4_ROW)

    used = {(a, b) for a, b, _ in best.legs}
    assert not used & {("a", "b"), ("b", "a")}, best
    assert len(best.legs) == 4 and best.cycle_s == pytest.approx(
        4 * 0.001 + 3 * V4_ROW / 125e6 + 64 / 125e6)
    # the order the machines were listed in crosses the slow leg on every token
    listed = sum(s for _, _, s in cycle(machines, links, V4_ROW))
    assert listed - best.cycle_s == pytest.approx(0.049)


def test_a_thin_link_carries_the_ring_back_edge_not_the_rows() -> None:
    machines = ["a", "b", "c"]
    thin = MeasuredLink(rtt_s=0.002, bytes_per_s=1.25e6)  # 10 Mbit/s between a and c
    # every ring of three crosses a-c one way or the other
    best = place(machines, mesh(machines, c_a=thin, a_c=thin), V4_ROW)

    rows = {(a, b) for a, b, _ in best.legs[:-1]}
    assert not rows & {("c", "a"), ("a", "c")}, best
    assert set(best.legs[-1][:2]) == {"a", "c"}  # the token, 64 bytes, crosses it cheaply
    assert best.order[1] == "b"


def test_a_chain_pays_each_slow_pair_both_ways_and_avoids_it() -> None:
    machines = ["a", "b", "c"]
    slow = MeasuredLink(rtt_s=0.060, bytes_per_s=125e6)
    best = place(machines, mesh(machines, a_c=slow, c_a=slow), V4_ROW, topology="chain")

    assert best.order in (("a", "b", "c"), ("c", "b", "a"))  # a and c never adjacent
    assert len(best.legs) == 4  # two rows down, two tokens back


def test_the_gateway_runs_nearest_the_first_stage() -> None:
    machines = ["a", "b"]
    far = MeasuredLink(rtt_s=0.080, bytes_per_s=125e6)
    links = mesh(["a", "b", "g1", "g2"], g1_a=far, g2_b=far)
    best = place(machines, links, V4_ROW, gateways=["g1", "g2"])

    assert (best.order[0], best.gateway) in (("b", "g1"), ("a", "g2"))
    assert best.gateway_s == pytest.approx(0.002)


def test_links_not_measured_and_bad_input_are_refused_by_name() -> None:
    links = mesh(["a", "b"])
    with pytest.raises(PlacementError, match="links not measured: a -> c, b -> c, c -> a"):
        place(["a", "b", "c"], links, V4_ROW)
    with pytest.raises(PlacementError, match="distinct machines"):
        place(["a", "a"], links, V4_ROW)
    with pytest.raises(PlacementError, match="topology 'star'"):
        place(["a", "b"], links, V4_ROW, topology="star")
    broken = dict(links)
    broken["a", "b"] = MeasuredLink(rtt_s=float("nan"), bytes_per_s=1.0)
    with pytest.raises(PlacementError, match="a -> b: not a usable measurement"):
        place(["a", "b"], broken, V4_ROW)
