"""When a route's Tracker daemon makes its next full pass (pure): at once when what it
reads of the cluster changed, every `sample_seconds` while its stages' answers change, and
every `quiet_seconds` while they stay the same. Hundreds of quiet routes then cost little:
a change in the cluster is seen within one sample period, a stage's new load within
`quiet_seconds`."""

from __future__ import annotations

from dataclasses import dataclass

_UNSEEN = object()


@dataclass
class Pace:
    sample_seconds: float
    quiet_seconds: float
    _inputs: object = _UNSEEN  # what the last pass read of the cluster
    _outcome: object = _UNSEEN  # what the stages answered in the last pass
    _next: float = 0.0  # monotonic time the next pass is due regardless

    def due(self, inputs: object, now: float) -> bool:
        """A pass is due: the cluster's side changed, or the interval is over."""
        return inputs != self._inputs or now >= self._next

    def passed(self, inputs: object, outcome: object, now: float) -> None:
        """Record a pass; an `outcome` of None (it failed, or said nothing) keeps the full
        rate."""
        same = outcome is not None and outcome == self._outcome
        self._next = now + (self.quiet_seconds if same else self.sample_seconds)
        self._inputs, self._outcome = inputs, outcome
