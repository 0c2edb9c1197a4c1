"""Where a chained stage sends its steps: the stages one stage of a route relays to, by
the recipe's topology (pure). Backends turn the names into addresses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.api.common import Topology


@dataclass(frozen=True)
class StageLinks:
    """A stage's outgoing links, by stage name; empty for a hub stage (the driver calls it)."""

    next_stage: str = ""  # chain: relay every step to this stage
    ring_last: str = ""  # ring, first stage only: take the last stage's sampled tokens

    def names(self) -> tuple[str, ...]:
        return tuple(name for name in (self.next_stage, self.ring_last) if name)


UNLINKED = StageLinks()  # a hub stage's, and the last stage's of any route


def stage_links(topology: Topology, stages: Sequence[str], index: int) -> StageLinks:
    """The links of `stages[index]`. The last stage has none (it answers), and a route of
    one stage is no chain."""
    if topology == "hub" or index + 1 >= len(stages):
        return UNLINKED
    ring_last = stages[-1] if topology == "ring" and index == 0 else ""
    return StageLinks(next_stage=stages[index + 1], ring_last=ring_last)
