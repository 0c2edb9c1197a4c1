"""What every handler of the operator shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.expectations import Expectations
from meshnet.operator.kube import KubeClient
from meshnet.operator.queue import KeyedQueue
from meshnet.operator.settings import OperatorSettings


@dataclass
class Context:
    """Settings, the API client, metrics, the per-object queue and the pod expectations."""

    settings: OperatorSettings
    client: KubeClient
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    queue: KeyedQueue = field(default_factory=KeyedQueue)
    expectations: Expectations = field(default_factory=Expectations)
    slots: asyncio.Semaphore = field(init=False)  # reconciles talking to the API at once
    # one wake-up per object a plan asked for (a drain that ends), with its task once due
    wakeups: dict[Hashable, asyncio.TimerHandle] = field(default_factory=dict)
    woken: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.settings.max_concurrent_reconciles)

    def wake_later(self, key: Hashable, delay: float,
                   work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` for `key` in `delay` seconds (instead of an earlier request's time):
        a plan that waits for a moment, not for an event, is reconciled at that moment
        rather than at the next resync."""
        if (pending := self.wakeups.pop(key, None)) is not None:
            pending.cancel()

        def due() -> None:
            self.wakeups.pop(key, None)
            task = asyncio.ensure_future(work())
            self.woken.add(task)
            task.add_done_callback(self._finished)

        self.wakeups[key] = asyncio.get_running_loop().call_later(delay, due)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.woken.discard(task)
        if not task.cancelled():
            task.exception()  # a failed wake-up is retried by the resync; never unobserved
