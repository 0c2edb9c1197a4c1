"""One reconcile per route at a time; triggers that arrive meanwhile collapse into a
single rerun, like a controller workqueue's deduplication; a trigger may ask to wait a
moment first, so that a burst (the pods of a route turning ready one by one) is one run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable


class KeyedQueue:
    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[None]] = {}
        self._dirty: set[Hashable] = set()
        self._waiting: set[Hashable] = set()  # keys whose first run has not started yet

    async def run(self, key: Hashable, work: Callable[[], Awaitable[None]],
                  delay: float = 0.0) -> None:
        """Run `work` for `key`, after `delay` seconds; while a run is waiting or in flight,
        wait for a run that starts later (many triggers, one run) and share its outcome."""
        if key in self._running:
            if key not in self._waiting:
                self._dirty.add(key)
            await asyncio.shield(self._running[key])
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[key] = done
        try:
            if delay > 0:
                self._waiting.add(key)
                try:
                    await asyncio.sleep(delay)
                finally:
                    self._waiting.discard(key)
            while True:
                self._dirty.discard(key)
                await work()
                if key not in self._dirty:
                    break
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # mark retrieved: the caller below re-raises it anyway
            raise
        else:
            done.set_result(None)
        finally:
            del self._running[key]
