"""A walk: how a session's steps go through the route in one topology. Every topology
implements the same three steps, so the session feeds, verifies and decodes without
knowing which one it walks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from meshnet.route.handshake import RouteInfo
from meshnet.route.topology import Topology, decodes_in_loop, pick_topology
from meshnet.route.topology.chain import ChainWalk
from meshnet.route.topology.hub import HubWalk
from meshnet.route.topology.loop import LoopWalk

if TYPE_CHECKING:
    from meshnet.route.session import Session, SessionSettings


class Walk(Protocol):
    topology: Topology  # what the generation reports
    loops: bool  # the first stage decodes by itself

    def feed(self, session: Session, tokens: list[int], n_past: int) -> int:
        """Runs `tokens` (at positions from `n_past`) through every stage; the token
        sampled after the last."""
        ...

    def verify(self, session: Session, tokens: list[int], discard: bool) -> list[int]:
        """One verification step of `tokens` (the last token and its drafts) after the
        history; the accepted drafts and the token after them. `discard`: the stages
        first drop what they hold past the history."""
        ...

    def decode(self, session: Session, token: int, count: int, stop_ids: set[int],
               pending: list[int], drafts: int) -> Iterator[int]:
        """Up to `count` tokens after `token`, stopping after a stop id; `pending[0]` is
        the token the route was last fed and has not answered yet (what a recovery must
        feed again). A failure propagates: the session recovers."""
        ...


def walk_for(route: RouteInfo, settings: SessionSettings) -> Walk:
    """The walk of the topology `settings` ask for, as `route` allows it (pick_topology)."""
    topology = pick_topology(route, settings.topology, loop=settings.loop)
    walk: Walk = HubWalk() if topology is Topology.HUB else ChainWalk(topology)
    if decodes_in_loop(route, topology, loop=settings.loop):
        return LoopWalk(walk)
    return walk
