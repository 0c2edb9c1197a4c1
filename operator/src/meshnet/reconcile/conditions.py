"""The one condition stamper of every resource we own (pure): verdicts in, metav1
Conditions out, each keeping its lastTransitionTime while its status stays the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from meshnet.api.common import Condition
from meshnet.timestamps import rfc3339

MESSAGE_LIMIT = 2048  # per condition: many stages or nodes must not make a huge status


@dataclass(frozen=True)
class Verdict:
    """What one condition should say now."""

    type: str
    status: bool
    reason: str
    message: str


def stamp(verdicts: Sequence[Verdict], previous: Sequence[Mapping[str, Any] | Condition],
          generation: int | None, now: datetime) -> list[Condition]:
    """Conditions in the verdicts' order; a condition whose status did not flip keeps the
    transition time it had in `previous` (raw status entries or Conditions)."""
    since_of: dict[str, tuple[str | None, str | None]] = {}
    for old in previous:
        raw = old.model_dump(by_alias=True) if isinstance(old, Condition) else old
        since_of[str(raw.get("type"))] = (raw.get("status"), raw.get("lastTransitionTime"))
    out = []
    for verdict in verdicts:
        status: Literal["True", "False"] = "True" if verdict.status else "False"
        was, since = since_of.get(verdict.type, (None, None))
        message = verdict.message
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 3] + "..."
        out.append(Condition(type=verdict.type, status=status, reason=verdict.reason,
                             message=message, observed_generation=generation,
                             last_transition_time=since if was == status and since
                             else rfc3339(now)))
    return out


def as_status(conditions: Sequence[Condition]) -> list[dict[str, Any]]:
    """Conditions as a status holds them (absent fields left out)."""
    return [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions]
