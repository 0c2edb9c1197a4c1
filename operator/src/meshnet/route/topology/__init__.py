"""How a generation goes through a route (docs/architecture.md): the topologies, and the
one choice among them, made from the handshake alone. The walks that carry a session's
steps in each are beside this: hub.py, chain.py, loop.py (the ring's too); walk.py says
what a walk is, and choose.py picks one.

Hub: the driver calls every stage in turn and carries each boundary on. Chain, preferred
whenever the workers were started with --next-stage: the driver calls the first stage
only, every stage relays its boundary to the next, and the last stage's token comes back
along the chain - the driver-to-stage legs drop from 2S to 2 and boundaries never pass
through the driver. Ring: a chain whose first stage decodes by itself and takes each token
straight from the last stage (--ring-last), S legs per token instead of 2(S-1).
"""

from __future__ import annotations

from typing import Literal, get_args

from meshnet.api.common import Topology
from meshnet.route.handshake import RouteInfo

# A topology asked for: the API's words (the CLI's and the JSON output's too), or "auto":
# ring, else chain, else hub.
Requested = Topology | Literal["auto"]
REQUESTABLE: tuple[Requested, ...] = ("auto", *get_args(Topology))


def pick_topology(route: RouteInfo, requested: Requested, *, loop: bool) -> Topology:
    """How a generation goes through `route`: ring (a decode loop the last stage feeds
    straight back to the first), chain or hub. `loop`: the first stage may decode by
    itself (the driver's decode loop is on and the last stage samples); a ring needs it."""
    if requested == "hub" or len(route.stages) < 2 or not route.chained:
        return "hub"
    return "ring" if route.ringed and loop else "chain"


def decodes_in_loop(route: RouteInfo, topology: Topology, *, loop: bool) -> bool:
    """The first stage decodes by itself (ForwardStream continue_tokens): `loop` allows it
    and the route is a chain, a ring, or one stage."""
    return loop and (len(route.stages) == 1 or topology != "hub")
