"""spec.boundaryCompression decided per leg (pure): Auto packs only a leg measured below the
break-even, in the direction the boundaries travel; unmeasured and fast legs stay raw; On and
Off override; near the break-even a leg keeps what its running stage does."""

from __future__ import annotations

from typing import Any

import pytest

from meshnet.api.shardroute import ShardRouteSpec
from meshnet.reconcile.route.linkcompression import (
    BREAK_EVEN_BITS_PER_SECOND,
    compressed_legs,
    compressing_stages,
    leg_compresses,
    replica_compresses,
)

SLOW, FAST = 100e6, 10e9  # bits per second: a consumer uplink, a datacentre link
EDGE = BREAK_EVEN_BITS_PER_SECOND * 1.05  # just above the break-even, inside the hysteresis


@pytest.mark.parametrize(("mode", "bits", "running", "packs"), [
    ("Auto", SLOW, None, True),
    ("Auto", FAST, None, False),
    ("Auto", None, None, False),  # unmeasured
    ("Auto", None, True, False),  # unmeasured: off, whatever runs
    ("Auto", FAST, True, False),
    ("Auto", SLOW, False, True),
    ("Auto", EDGE, None, False),  # no stage running: the plain comparison
    ("Auto", EDGE, True, True),  # within 10% of the break-even: keeps what runs
    ("Auto", EDGE, False, False),
    ("On", FAST, None, True),
    ("On", None, None, True),
    ("Off", SLOW, None, False),
    ("Off", SLOW, True, False),
])
def test_a_leg_packs_as_its_mode_and_measured_bandwidth_say(
        mode: str, bits: float | None, running: bool | None, packs: bool) -> None:
    assert leg_compresses(mode, bits, running) is packs


def spec(mode: str = "Auto", topology: str = "ring") -> ShardRouteSpec:
    return ShardRouteSpec.model_validate({
        "artifactRef": {"name": "a"}, "recipe": {"topology": topology},
        "boundaryCompression": mode, "placement": "Measured",
        "stages": [{"name": f"s{i}", "layers": {"begin": 10 * i, "end": 10 * i + 10}}
                   for i in range(3)]})


def placement(slow: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """Every link of node-a, -b, -c fast but `slow` (bytes per second in status)."""
    nodes = ("node-a", "node-b", "node-c")
    return {"currentOrder": list(nodes), **extra, "links": [
        {"fromNode": a, "toNode": b, "rttSeconds": 0.01,
         "bytesPerSecond": (SLOW if (a, b) == slow else FAST) / 8}
        for a in nodes for b in nodes if a != b]}


def test_auto_packs_only_the_stage_that_sends_over_the_slow_leg() -> None:
    packing = compressing_stages(spec(), placement(("node-b", "node-c")), {})
    assert packing == {"s1"}
    assert compressed_legs(spec(), packing) == ["s1->s2"]


def test_the_slow_direction_is_the_one_the_boundaries_travel() -> None:
    # c -> b is slow, but s1 on b sends to s2 on c: nothing to pack
    assert compressing_stages(spec(), placement(("node-c", "node-b")), {}) == frozenset()


def test_the_operators_assignment_decides_which_nodes_a_leg_joins() -> None:
    # reassigned: s0 on c, s1 on b, s2 on a: the slow c -> b leg is now s0's
    assigned = placement(("node-c", "node-b"),
                         assignment={"s0": "node-c", "s1": "node-b", "s2": "node-a"})
    assert compressing_stages(spec(), assigned, {}) == {"s0"}


def test_unmeasured_routes_do_not_pack_unless_on_and_off_never_packs() -> None:
    assert compressing_stages(spec(), None, {}) == frozenset()
    assert compressing_stages(spec("On"), None, {}) == {"s0", "s1"}  # the last relays nothing
    assert compressing_stages(spec("Off"), placement(("node-a", "node-b")), {}) == frozenset()


def test_a_hub_routes_stages_relay_nothing_to_pack() -> None:
    assert compressing_stages(spec("On", "hub"), None, {}) == frozenset()


def test_other_replicas_pack_only_when_on() -> None:
    auto, on = spec(), spec("On")
    assert not replica_compresses(auto, 1, "s1", frozenset({"s1"}))
    assert replica_compresses(auto, 0, "s1", frozenset({"s1"}))
    assert replica_compresses(on, 1, "s0", frozenset())
    assert not replica_compresses(on, 1, "s2", frozenset())
