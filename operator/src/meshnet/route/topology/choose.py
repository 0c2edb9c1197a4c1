"""The walk a session takes on a route: its topology's, looping where the route allows."""

from __future__ import annotations

from meshnet.route.handshake import RouteInfo
from meshnet.route.topology import Requested, decodes_in_loop, pick_topology
from meshnet.route.topology.chain import ChainWalk
from meshnet.route.topology.hub import HubWalk
from meshnet.route.topology.loop import LoopWalk
from meshnet.route.topology.walk import Walk


def walk_for(route: RouteInfo, requested: Requested, *, loop: bool) -> Walk:
    """The walk of the topology `requested`, as `route` allows it (pick_topology). `loop`:
    the first stage may decode by itself."""
    topology = pick_topology(route, requested, loop=loop)
    walk: Walk = HubWalk() if topology == "hub" else ChainWalk(topology)
    if decodes_in_loop(route, topology, loop=loop):
        return LoopWalk(walk)
    return walk
