"""One reconcile per route at a time; triggers that arrive meanwhile collapse into a
single rerun, like a controller workqueue's deduplication."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable


class KeyedQueue:
    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[None]] = {}
        self._dirty: set[Hashable] = set()

    async def run(self, key: Hashable, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` for `key`; while a run is in flight, wait for a rerun that starts later
        (many triggers, one rerun) and share its outcome."""
        if key in self._running:
            self._dirty.add(key)
            await asyncio.shield(self._running[key])
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[key] = done
        try:
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
