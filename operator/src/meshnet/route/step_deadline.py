"""How long a stage may take to answer a step, from how long its steps took before: a
frozen stage (stopped, swapping, wedged) is noticed in bounded time instead of hanging
the generation, while a slow but working one is not."""

from __future__ import annotations

import threading
from collections import deque

# Before anything was measured (a first step may load caches, or be a long prefill).
UNMEASURED_SECONDS = 120.0
# Never less than this: a step can queue behind other sessions' steps.
FLOOR_SECONDS = 10.0
# Times the slowest recent step, per row.
MARGIN = 10.0
WINDOW = 32


class StepDeadline:
    """Thread-safe: one per stage, shared by every session on it."""

    def __init__(self, floor: float = FLOOR_SECONDS, margin: float = MARGIN,
                 unmeasured: float = UNMEASURED_SECONDS) -> None:
        self.floor = floor
        self.margin = margin
        self.unmeasured = unmeasured
        self._rates: deque[float] = deque(maxlen=WINDOW)  # seconds per row
        self._lock = threading.Lock()

    def seconds(self, rows: int) -> float:
        """The deadline for a step of `rows` rows."""
        with self._lock:
            if not self._rates:
                return self.unmeasured
            slowest = max(self._rates)
        return self.floor + self.margin * slowest * max(rows, 1)

    def observe(self, seconds: float, rows: int) -> None:
        """A step of `rows` rows was answered after `seconds`."""
        with self._lock:
            self._rates.append(max(seconds, 0.0) / max(rows, 1))
