"""What every handler of the operator shares."""

from __future__ import annotations

import asyncio
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

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.settings.max_concurrent_reconciles)
