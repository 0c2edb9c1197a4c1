"""What the ShardRoute and ModelArtifact handlers share: one handler for every trigger of
a resource, and one way to run a reconcile (serialised per object, bounded in number,
counted, an API failure retried by kopf)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar, cast

import kopf

from meshnet.errors import KubeApiError
from meshnet.operator.context import Context

Handler = TypeVar("Handler", bound=Callable[..., Any])


def on_every_trigger(registry: kopf.OperatorRegistry, resource: tuple[str, str, str],
                     resync_seconds: float) -> Callable[[Handler], Handler]:
    """Registers a level-based handler for `resource`'s resume, create, update and delete,
    and a resync timer: whatever happened, it reconciles the object as it is."""
    def register(handler: Handler) -> Handler:
        triggers = (
            kopf.on.timer(*resource, interval=resync_seconds, initial_delay=resync_seconds,
                          registry=registry),
            kopf.on.delete(*resource, registry=registry),
            kopf.on.update(*resource, registry=registry),
            kopf.on.create(*resource, registry=registry),
            kopf.on.resume(*resource, registry=registry),
        )
        registered: Any = handler
        for trigger in triggers:
            registered = trigger(registered)
        return cast(Handler, registered)
    return register


async def run_reconcile(ctx: Context, kind: str, key: Hashable,
                        once: Callable[[], Awaitable[None]], delay: float = 0.0) -> None:
    """`once` for the object `key` of `kind`: never two at a time for one object, at most
    `max_concurrent_reconciles` at once; `delay` lets the triggers of the next moment
    join in. A failed API call comes back from kopf, sooner after a conflict."""
    async def counted() -> None:
        async with ctx.slots:
            started = time.monotonic()
            ctx.metrics.reconciles.labels(kind).inc()
            try:
                await once()
            except KubeApiError as exc:
                ctx.metrics.errors.labels(kind).inc()
                retry = 1 if exc.status == 409 else 10  # a conflict clears on the next read
                raise kopf.TemporaryError(str(exc), delay=retry) from exc
            finally:
                ctx.metrics.duration.labels(kind).observe(time.monotonic() - started)

    await ctx.queue.run(key, counted, delay)
