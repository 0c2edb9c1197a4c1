"""POSTs reports to the Tracker: JSON over HTTP(S) with a bearer token, bounded retries
with full-jitter exponential backoff. A failure is an answer (Delivery), never an
exception: reporting must not take anything else down with it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from meshnet.tracker.metrics import TrackerMetrics

# Answers worth another attempt; any other 4xx means the request itself is refused.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # in all, the first one included
    base_seconds: float = 0.5
    cap_seconds: float = 8.0
    timeout_seconds: float = 10.0  # per attempt

    def backoff(self, attempt: int, draw: float) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2^attempt)); `draw` in [0, 1)."""
        return draw * min(self.cap_seconds, self.base_seconds * 2.0 ** attempt)


@dataclass(frozen=True)
class Delivery:
    ok: bool
    attempts: int
    status: int | None = None  # the last HTTP status, None when none came back
    error: str = ""
    retry_after: float | None = None  # seconds the Tracker asked us to wait

    @property
    def failure_reason(self) -> str:
        """A bounded label for the failure metric."""
        if self.status is None:
            return "transport"
        return "rejected" if self.status < 500 and self.status not in RETRY_STATUSES \
            else "unavailable"


Sleep = Callable[[float], Awaitable[None]]


class TrackerClient:
    def __init__(self, url: str, token: Callable[[], str | None], *,
                 policy: RetryPolicy = RetryPolicy(), metrics: TrackerMetrics | None = None,
                 sleep: Sleep = asyncio.sleep, draw: Callable[[], float] = random.random,
                 verify: bool | str = True) -> None:
        self.url = url
        self.token = token  # read on every send: a rotated Secret takes effect at once
        self.policy = policy
        self.metrics = metrics or TrackerMetrics()
        self._sleep, self._draw = sleep, draw
        self._http = httpx.AsyncClient(timeout=policy.timeout_seconds, verify=verify)

    async def close(self) -> None:
        await self._http.aclose()

    async def send(self, report: Mapping[str, Any]) -> Delivery:
        headers = {"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE}
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        last = Delivery(ok=False, attempts=0)
        for attempt in range(self.policy.attempts):
            if attempt:
                self.metrics.retries.inc()
                await self._sleep(self._delay(attempt - 1, last))
            last = await self._attempt(attempt + 1, report, headers)
            if last.ok or (last.status is not None and last.status not in RETRY_STATUSES):
                break
        if last.ok:
            self.metrics.sent.inc()
            self.metrics.last_success.set(time.time())
        else:
            self.metrics.failed.labels(last.failure_reason).inc()
        return last

    async def _attempt(self, number: int, report: Mapping[str, Any],
                       headers: dict[str, str]) -> Delivery:
        try:
            response = await self._http.post(self.url, json=report, headers=headers)
        except httpx.HTTPError as exc:
            return Delivery(ok=False, attempts=number, error=f"{type(exc).__name__}: {exc}")
        ok = 200 <= response.status_code < 300
        return Delivery(ok=ok, attempts=number, status=response.status_code,
                        error="" if ok else f"HTTP {response.status_code}: {response.text[:200]}",
                        retry_after=_retry_after(response))

    def _delay(self, attempt: int, last: Delivery) -> float:
        """The jittered backoff, or the Tracker's Retry-After when it asked (capped)."""
        if last.retry_after is not None:
            return min(last.retry_after, self.policy.cap_seconds)
        return self.policy.backoff(attempt, self._draw())


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None
