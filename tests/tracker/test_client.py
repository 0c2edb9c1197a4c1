"""Reports reach a real HTTP receiver as JSON with the bearer token; a Tracker that fails
or is down costs a bounded number of jittered retries and raises the failure metric."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from meshnet.devtools.tracker import LoopbackTracker
from meshnet.local.process import free_port
from meshnet.tracker.client import RetryPolicy, TrackerClient
from meshnet.tracker.metrics import TrackerMetrics

from .conftest import TOKEN

REPORT = {"apiVersion": "meshnet.tracker/v1", "kind": "CapacityReport", "sequence": 1}
FAST = RetryPolicy(attempts=4, base_seconds=0.01, cap_seconds=0.05, timeout_seconds=2.0)


def send(url: str, token: str | None = TOKEN, policy: RetryPolicy = FAST,
         metrics: TrackerMetrics | None = None, sleeps: list[float] | None = None) -> Any:
    async def run() -> Any:
        async def sleep(seconds: float) -> None:
            if sleeps is not None:
                sleeps.append(seconds)
            await asyncio.sleep(seconds)

        client = TrackerClient(url, lambda: token, policy=policy, metrics=metrics, sleep=sleep)
        try:
            return await client.send(REPORT)
        finally:
            await client.close()

    return asyncio.run(run())


def value(metrics: TrackerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_report_arrives_as_json_with_the_bearer_token(tracker: LoopbackTracker) -> None:
    metrics = TrackerMetrics()
    before = time.time()

    delivery = send(tracker.url, metrics=metrics)

    assert delivery.ok and delivery.attempts == 1 and delivery.status == 202
    received = tracker.received[0]
    assert received.headers["Authorization"] == f"Bearer {TOKEN}"
    assert received.headers["Content-Type"] == "application/json"
    assert received.body == REPORT
    assert value(metrics, "meshnet_tracker_reports_sent_total") == 1
    assert value(metrics, "meshnet_tracker_last_success_timestamp_seconds") >= before


def test_a_tracker_answering_503_is_retried_until_it_accepts(tracker: LoopbackTracker) -> None:
    tracker.fail_next(2, status=503)
    metrics = TrackerMetrics()

    delivery = send(tracker.url, metrics=metrics)

    assert delivery.ok and delivery.attempts == 3
    assert [r.status for r in tracker.received] == [503, 503, 202]
    assert value(metrics, "meshnet_tracker_report_retries_total") == 2
    assert value(metrics, "meshnet_tracker_reports_failed_total", reason="unavailable") == 0


def test_a_tracker_that_is_down_costs_bounded_jittered_attempts_and_counts_a_failure() -> None:
    metrics, sleeps = TrackerMetrics(), []
    url = f"http://127.0.0.1:{free_port()}/v1/reports"  # nothing listens there

    delivery = send(url, metrics=metrics, sleeps=sleeps)

    assert not delivery.ok and delivery.attempts == 4 and delivery.status is None
    assert "ConnectError" in delivery.error
    assert len(sleeps) == 3 and all(0 <= s <= FAST.cap_seconds for s in sleeps)
    assert value(metrics, "meshnet_tracker_reports_failed_total", reason="transport") == 1
    assert value(metrics, "meshnet_tracker_report_retries_total") == 3
    assert value(metrics, "meshnet_tracker_reports_sent_total") == 0


def test_a_refused_token_is_not_retried(tracker: LoopbackTracker) -> None:
    metrics = TrackerMetrics()

    delivery = send(tracker.url, token="wrong", metrics=metrics)

    assert not delivery.ok and delivery.attempts == 1 and delivery.status == 401
    assert value(metrics, "meshnet_tracker_reports_failed_total", reason="rejected") == 1


def test_retry_after_from_the_tracker_is_honoured_up_to_the_cap(tracker: LoopbackTracker) -> None:
    tracker.fail_next(1, status=429, headers={"Retry-After": "0.03"})
    sleeps: list[float] = []

    delivery = send(tracker.url, sleeps=sleeps)

    assert delivery.ok and sleeps == [0.03]


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    policy = RetryPolicy(base_seconds=0.5, cap_seconds=8.0)

    assert [policy.backoff(n, 0.999) for n in range(6)] == [
        0.4995, 0.999, 1.998, 3.996, 7.992, 7.992]
    assert policy.backoff(3, 0.0) == 0.0
