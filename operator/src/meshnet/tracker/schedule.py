"""When to send: on every change that matters to a router, and at least every N seconds
so the Tracker can expire routes whose reporter went silent (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshnet.api.tracker import CapacityReport
from meshnet.digests import canonical_digest

# Figures that move all the time without changing where sessions should go.
_VOLATILE_TOP = ("sequence", "generatedAt")
_VOLATILE_HEALTH = ("uptimeSeconds",)


def fingerprint(report: CapacityReport) -> str:
    """Digest of the report without its clock-driven and load figures."""
    data: dict[str, Any] = report.model_dump(mode="json", by_alias=True)
    for key in _VOLATILE_TOP:
        data.pop(key, None)
    data["capacity"].pop("recentTokensPerSecond", None)
    for stage in data["stages"]:
        stage.pop("load", None)
        for key in _VOLATILE_HEALTH:
            stage["health"].pop(key, None)
    return canonical_digest(data)


@dataclass
class Cadence:
    """One route's reporting state."""

    every_seconds: float
    sequence: int = 0
    last_fingerprint: str | None = None
    last_success: float | None = None  # monotonic time of the last delivered report
    first_seen: dict[str, float] = field(default_factory=dict)  # incarnation -> unix time

    def due(self, print_: str, now: float) -> bool:
        """A changed report is due at once; an unchanged one every `every_seconds`."""
        if print_ != self.last_fingerprint or self.last_success is None:
            return True
        return now - self.last_success >= self.every_seconds

    def delivered(self, print_: str, now: float) -> None:
        self.last_fingerprint, self.last_success = print_, now

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def seen(self, incarnations: list[str], unix_now: float) -> dict[str, float]:
        """Remember when each incarnation was first seen; forget ones no longer running."""
        self.first_seen = {i: self.first_seen.get(i, unix_now) for i in incarnations}
        return self.first_seen
