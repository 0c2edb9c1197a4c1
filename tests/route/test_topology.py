"""The topology is picked from the handshake alone: a ring where the first stage is
subscribed at the last one and may loop, else a chain where every stage relays, else
the hub; and the first stage decodes by itself on a chain, a ring or a single stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import pytest

from meshnet.api.common import Topology
from meshnet.route.handshake import RouteInfo
from meshnet.route.topology import REQUESTABLE, Requested, decodes_in_loop, pick_topology

MakeRoute = Callable[..., RouteInfo]


def test_the_topology_words_are_the_apis_and_auto() -> None:
    assert REQUESTABLE == ("auto", "hub", "chain", "ring")
    assert set(REQUESTABLE) - {"auto"} == set(get_args(Topology))


@pytest.mark.parametrize("requested", ["auto", "chain", "ring"])
def test_a_ringed_route_that_may_loop_goes_as_a_ring(
    make_route_info: MakeRoute, requested: Requested,
) -> None:
    route = make_route_info(3, chained=True, ringed=True)
    assert pick_topology(route, requested, loop=True) == "ring"


def test_a_ringed_route_without_the_decode_loop_goes_as_a_chain(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3, chained=True, ringed=True)
    assert pick_topology(route, "auto", loop=False) == "chain"


def test_a_chained_route_goes_as_a_chain_unless_the_hub_is_asked_for(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3, chained=True)
    assert pick_topology(route, "auto", loop=True) == "chain"
    assert pick_topology(route, "hub", loop=True) == "hub"


def test_a_route_with_a_stage_that_does_not_relay_goes_through_the_hub(
    make_route_info: MakeRoute,
) -> None:
    assert pick_topology(make_route_info(3), "auto", loop=True) == "hub"


def test_a_single_stage_goes_through_the_hub_and_decodes_in_its_own_loop(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(1)
    assert pick_topology(route, "auto", loop=True) == "hub"
    assert decodes_in_loop(route, "hub", loop=True)
    assert not decodes_in_loop(route, "hub", loop=False)


def test_only_the_hub_of_several_stages_decodes_step_by_step_from_the_driver(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3, chained=True, ringed=True)
    assert not decodes_in_loop(route, "hub", loop=True)
    assert decodes_in_loop(route, "chain", loop=True)
    assert decodes_in_loop(route, "ring", loop=True)
    assert not decodes_in_loop(route, "chain", loop=False)
