"""The best order of a route's machines, as pure arithmetic on measured links.

A stage's layers are fixed by its position, so what placement chooses is which machine takes
each position. Per decoded token the first stage's decode loop sends a boundary row down the
stages and gets the token back: in a ring from the last stage straight, in a chain answered
back up the stages. Each leg costs its one-way delay plus the bytes it carries over its
bandwidth. The order with
the cheapest cycle wins; among equals, the one whose first stage is nearest a gateway
candidate (a ring's gateway talks only to its first stage). Exhaustive for the few stages a
route has (8 machines: 40,320 orders), so the best is the best, not a heuristic's."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TOKEN_BYTES = 64  # a sampled token and its framing, the ring's back edge and the answer
MAX_MACHINES = 9  # 9! orders, ~1 s of Python; routes have fewer stages


@dataclass(frozen=True)
class MeasuredLink:
    """What was measured from one machine to another."""

    rtt_s: float
    bytes_per_s: float

    def seconds(self, nbytes: int) -> float:
        """One message of `nbytes` over this link: half the round trip, then its bytes."""
        return self.rtt_s / 2 + nbytes / self.bytes_per_s


Links = Mapping[tuple[str, str], MeasuredLink]  # (from, to) -> link; one per direction


@dataclass(frozen=True)
class Placement:
    order: tuple[str, ...]  # order[i] serves stage i
    gateway: str | None  # where the gateway should run, of the candidates; None: none given
    cycle_s: float  # network seconds per decoded token on the order's legs
    gateway_s: float  # the gateway's round trip to the first stage (0 without candidates)
    legs: tuple[tuple[str, str, float], ...]  # every leg of the cycle and its seconds


class PlacementError(ValueError):
    """The machines cannot be placed: a link was not measured, or too many machines."""


def place(machines: Sequence[str], links: Links, row_bytes: int, topology: str = "ring",
          gateways: Sequence[str] = (), fixed: Mapping[int, str] | None = None) -> Placement:
    """The order of `machines` (one per stage) with the cheapest per-token cycle, and the
    gateway candidate nearest its first stage. `row_bytes`: one boundary row on the wire;
    `fixed`: positions whose machine is given (a stage the user pinned to its node)."""
    if not machines or len(set(machines)) != len(machines):
        raise PlacementError("placement needs distinct machines, one per stage")
    if len(machines) > MAX_MACHINES:
        raise PlacementError(f"{len(machines)} machines: at most {MAX_MACHINES} are ordered")
    if topology not in ("ring", "chain"):
        raise PlacementError(f"topology {topology!r}: ring or chain")
    _check_measured(machines, links, gateways)
    fixed = fixed or {}
    if not set(fixed.values()) <= set(machines) or not all(
            0 <= i < len(machines) for i in fixed):
        raise PlacementError("a fixed position names no machine or no stage")
    best: Placement | None = None
    for order in itertools.permutations(machines):
        if any(order[i] != machine for i, machine in fixed.items()):
            continue
        candidate = _scored(order, links, row_bytes, topology, gateways)
        if best is None or _key(candidate) < _key(best):
            best = candidate
    assert best is not None
    return best


def cycle(order: Sequence[str], links: Links, row_bytes: int,
          topology: str = "ring") -> tuple[tuple[str, str, float], ...]:
    """The legs one decoded token crosses in `order`, each with its seconds: the boundary
    row down the stages, then the token back to the first stage (a ring: from the last
    stage straight; a chain: answered back up the stages)."""
    down = [(a, b, links[a, b].seconds(row_bytes)) for a, b in itertools.pairwise(order)]
    if len(order) < 2:
        return ()
    if topology == "ring":
        back = [(order[-1], order[0], links[order[-1], order[0]].seconds(TOKEN_BYTES))]
    else:
        back = [(b, a, links[b, a].seconds(TOKEN_BYTES))
                for a, b in reversed(list(itertools.pairwise(order)))]
    return tuple(down + back)


def _scored(order: tuple[str, ...], links: Links, row_bytes: int, topology: str,
            gateways: Sequence[str]) -> Placement:
    nearest = min(gateways, default=None,
                  key=lambda g: (_round_trip(g, order[0], links), g))
    legs = cycle(order, links, row_bytes, topology)
    return Placement(order, nearest, sum(s for _, _, s in legs),
                     _round_trip(nearest, order[0], links) if nearest else 0.0, legs)


def _round_trip(a: str, b: str, links: Links) -> float:
    return 0.0 if a == b else links[a, b].rtt_s


def _key(placement: Placement) -> tuple[float, float, tuple[str, ...]]:
    # a few microseconds of measurement noise must not decide between equal orders
    return (round(placement.cycle_s, 6), round(placement.gateway_s, 6), placement.order)


def _check_measured(machines: Sequence[str], links: Links, gateways: Sequence[str]) -> None:
    pairs = [(a, b) for a in machines for b in machines if a != b]
    pairs += [(g, m) for g in gateways for m in machines if g != m]
    missing = sorted(p for p in pairs if p not in links)
    if missing:
        raise PlacementError("links not measured: " + ", ".join(f"{a} -> {b}"
                                                                for a, b in missing[:6])
                             + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    bad = sorted(p for p in pairs if not (math.isfinite(links[p].rtt_s) and links[p].rtt_s >= 0
                                          and links[p].bytes_per_s > 0))
    if bad:
        raise PlacementError(f"link {bad[0][0]} -> {bad[0][1]}: not a usable measurement")
