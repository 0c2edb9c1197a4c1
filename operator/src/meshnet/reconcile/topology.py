"""Where a chained stage sends its steps: the --next-stage and --ring-last addresses of
one stage of a route, by the recipe's topology (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshnet.api.common import Topology


@dataclass(frozen=True)
class StageLinks:
    """A stage's outgoing links; empty strings for a hub stage (the driver calls it)."""

    next_stage: str = ""  # chain: relay every step to this stage
    ring_last: str = ""  # ring, first stage only: take the last stage's sampled tokens


UNLINKED = StageLinks()  # a hub stage's, and the last stage's of any route


def stage_links(topology: Topology, stages: Sequence[str], index: int,
                address: Callable[[str], str]) -> StageLinks:
    """The links of `stages[index]`, naming the other stages by `address(name)`. The last
    stage has none (it answers), and a route of one stage is no chain."""
    if topology == "hub" or index + 1 >= len(stages):
        return UNLINKED
    ring_last = address(stages[-1]) if topology == "ring" and index == 0 else ""
    return StageLinks(next_stage=address(stages[index + 1]), ring_last=ring_last)
