"""Admission alone: slots, then a queue served in arrival order, then QueueFull; a waiter
that goes away leaves the queue without taking a slot."""

from __future__ import annotations

import asyncio

import pytest

from meshnet.gateway.admission import Admission, QueueFull


async def hold(admission: Admission, name: str, order: list[str], release: asyncio.Event,
               ) -> None:
    async with admission.slot():
        order.append(name)
        await release.wait()


def test_waiters_get_slots_in_arrival_order_and_the_queue_is_bounded() -> None:
    async def scenario() -> None:
        admission = Admission(slots=2, max_waiting=2)
        order: list[str] = []
        release = {name: asyncio.Event() for name in "abcd"}
        tasks = {}
        for name in "abcd":
            tasks[name] = asyncio.create_task(hold(admission, name, order, release[name]))
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["a", "b"] and admission.running == 2 and admission.waiting == 2
        with pytest.raises(QueueFull):
            async with admission.slot():
                pass
        release["b"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c"]  # the oldest waiter, not a newcomer
        late = asyncio.create_task(hold(admission, "e", order, asyncio.Event()))
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c"] and admission.waiting == 2  # e queues behind d
        release["a"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c", "d"]
        late.cancel()
        release["c"].set()
        release["d"].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert admission.running == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_a_waiter_cancelled_in_the_queue_takes_no_slot() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, max_waiting=4)
        release = asyncio.Event()
        order: list[str] = []
        first = asyncio.create_task(hold(admission, "first", order, release))
        await asyncio.sleep(0)
        gone = asyncio.create_task(hold(admission, "gone", order, asyncio.Event()))
        after = asyncio.create_task(hold(admission, "after", order, asyncio.Event()))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        assert admission.waiting == 1
        release.set()
        await first
        await asyncio.sleep(0)
        assert order == ["first", "after"] and admission.running == 1
        after.cancel()
        await asyncio.gather(after, return_exceptions=True)
        assert admission.running == 0

    asyncio.run(scenario())
