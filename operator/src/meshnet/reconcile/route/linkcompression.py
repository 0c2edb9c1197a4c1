"""Which stages of a route pack the boundaries they relay to the next stage (pure):
spec.boundaryCompression against each leg's bandwidth as spec.placement Measured measured it
(status.placement), the direction stage i's node -> stage i+1's node (docs/placement.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from meshnet.api.shardroute import ShardRouteSpec, Stage

# Packing pays only below this (docs/protocol.md, "Boundary compression"): measured by
# bench/boundary_compression.py at DeepSeek V4's width (64 KiB a row, ratio 1.162, 175 us to
# pack and unpack on one core). Narrower models break even lower (SmolLM2: ~57 Mbit/s); the
# operator's MESHNET_COMPRESSION_BREAK_EVEN_MBPS overrides it.
BREAK_EVEN_BITS_PER_SECOND = 416e6
# Within 10% of the break-even a leg keeps what its running stage does: a new measurement
# that moves a little never restarts a stage to flip it.
HYSTERESIS = 0.10


def leg_compresses(mode: str, bits_per_second: float | None, running: bool | None,
                   break_even: float = BREAK_EVEN_BITS_PER_SECOND) -> bool:
    """Whether a leg carries packed boundaries under `mode` (spec.boundaryCompression), at
    its measured `bits_per_second` (None: unmeasured), while its sending stage's pod
    `running` packs or not (None: no pod)."""
    if mode == "Off":
        return False
    if mode == "On":
        return True
    if bits_per_second is None:
        return False
    if running is not None and abs(bits_per_second - break_even) < HYSTERESIS * break_even:
        return running
    return bits_per_second < break_even


def stage_nodes(stages: Sequence[Stage], placement: Mapping[str, Any] | None) -> dict[str, str]:
    """Stage -> the node it serves from as placement knows it: the node the operator assigns
    it to, else the one it ran on when the links were measured."""
    placement = placement or {}
    order = placement.get("currentOrder") or []
    nodes = {s.name: node for s, node in zip(stages, order, strict=False)} \
        if len(order) == len(stages) else {}
    return {**nodes, **(placement.get("assignment") or {})}


def compressing_stages(spec: ShardRouteSpec, placement: Mapping[str, Any] | None,
                       running: Mapping[str, bool],
                       break_even: float = BREAK_EVEN_BITS_PER_SECOND) -> frozenset[str]:
    """The stages of replica 0 that pack what they relay to the next stage. `placement`:
    status.placement; `running`: stage -> whether its pod of replica 0 packs now. A hub's
    stages relay nothing (its gateway carries every boundary)."""
    if spec.recipe.topology == "hub":
        return frozenset()
    nodes = stage_nodes(spec.stages, placement)
    bandwidth = {(x["fromNode"], x["toNode"]): 8 * float(x["bytesPerSecond"])
                 for x in (placement or {}).get("links") or []}
    return frozenset(
        sender.name for sender, receiver in pairwise(spec.stages)
        if leg_compresses(spec.boundary_compression,
                          bandwidth.get((nodes.get(sender.name, ""), nodes.get(receiver.name, ""))),
                          running.get(sender.name), break_even))


def replica_compresses(spec: ShardRouteSpec, replica: int, stage: str,
                       replica0: frozenset[str]) -> bool:
    """Whether `stage` of `replica` packs: replica 0 as measured; the others' nodes are never
    measured (Measured places one pipeline), so only On turns them on."""
    if replica == 0:
        return stage in replica0
    last = spec.stages[-1].name
    return spec.boundary_compression == "On" and spec.recipe.topology != "hub" and stage != last


def compressed_legs(spec: ShardRouteSpec, replica0: frozenset[str]) -> list[str]:
    """status.compressedLegs: sender->receiver of each leg replica 0 packs."""
    return [f"{a.name}->{b.name}" for a, b in pairwise(spec.stages)
            if a.name in replica0]
