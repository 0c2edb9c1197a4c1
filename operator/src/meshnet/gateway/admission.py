"""Admission of requests to a route: as many at once as the route has session slots, then a
bounded queue in arrival order, then QueueFull (HTTP 429)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    """Every slot is busy and the queue is full."""


class Admission:
    def __init__(self, slots: int, max_waiting: int) -> None:
        self.capacity = max(1, slots)
        self.max_waiting = max_waiting
        self.running = 0
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def resize(self, slots: int) -> None:
        """The route's slots changed (a new epoch): admit up to the new number."""
        self.capacity = max(1, slots)
        self._admit()

    def _admit(self) -> None:
        """Hands free slots to the oldest waiters (a slot is taken on their behalf)."""
        while self._queue and self.running < self.capacity:
            waiter = self._queue.popleft()
            if not waiter.done():
                self.running += 1
                waiter.set_result(None)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Holds one of the route's slots while the block runs; QueueFull when neither a
        slot nor a place in the queue is free. A caller cancelled while it waits leaves
        the queue."""
        if self.running < self.capacity and not self._queue:
            self.running += 1
        elif len(self._queue) >= self.max_waiting:
            raise QueueFull(f"all {self.capacity} session slots are busy and "
                            f"{len(self._queue)} requests are waiting")
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._queue.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.running -= 1  # admitted just as it was cancelled: give it back
                    self._admit()
                else:
                    self._queue.remove(waiter)
                raise
        try:
            yield
        finally:
            self.running -= 1
            self._admit()
