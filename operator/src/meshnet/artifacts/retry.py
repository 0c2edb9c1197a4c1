"""Bounded retries with jittered exponential backoff (pure: the caller sleeps)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    # Attempts in a row that gained no byte; an attempt that made progress resets the count,
    # so a long download over a flaky link is not cut short.
    max_attempts: int = 8
    base_seconds: float = 0.5
    cap_seconds: float = 30.0

    def delay(self, failures: int, rng: random.Random) -> float:
        """'Full jitter': uniform in [0, min(cap, base * 2**(failures-1))]."""
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** max(0, failures - 1))
        return rng.uniform(0.0, ceiling)

    def exhausted(self, failures: int) -> bool:
        return failures >= self.max_attempts
