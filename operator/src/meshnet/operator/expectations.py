"""Children the operator created or deleted whose watch events have not reached the
indices yet (controller-runtime's "expectations"): the planner sees them as done, so
a reconcile that races its own writes neither creates twice nor reports twice; and the
watch's echoes that show the planner nothing new (a pod we created, as created; one of
several pods we deleted, while others are still going) are known as such."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Mapping
from typing import Any

from meshnet.reconcile import ObservedPod, observe_pod

TTL_SECONDS = 60.0  # an expectation the watch never confirms is dropped after this


class Expectations:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._created: dict[Hashable, dict[str, tuple[float, ObservedPod]]] = {}
        self._deleted: dict[Hashable, dict[str, float]] = {}

    def created(self, key: Hashable, pod: Mapping[str, Any]) -> None:
        observed = observe_pod(pod)
        if observed is not None:
            self._created.setdefault(key, {})[observed.name] = (self._clock(), observed)

    def echo(self, key: Hashable, pod: Mapping[str, Any]) -> bool:
        """True when `pod` is one we created, still as the API server returned it to us."""
        observed = observe_pod(pod)
        expected = self._created.get(key, {}).get(observed.name) if observed else None
        return expected is not None and expected[1] == observed

    def deleted(self, key: Hashable, name: str) -> None:
        self._deleted.setdefault(key, {})[name] = self._clock()

    def gone(self, key: Hashable, name: str) -> bool:
        """Record that pod `name` is gone; True when we deleted it and others we deleted
        are still going (a new epoch starts only once the last one is gone)."""
        going = self._deleted.get(key, {})
        if going.pop(name, None) is None:
            return False
        now = self._clock()
        return any(now - t < TTL_SECONDS for t in going.values())

    def apply(self, key: Hashable, indexed: tuple[ObservedPod, ...]) -> tuple[ObservedPod, ...]:
        """The indexed pods, plus pods created since, with pods deleted since terminating."""
        now, names = self._clock(), {p.name for p in indexed}
        created = {n: v for n, v in self._created.get(key, {}).items()
                   if n not in names and now - v[0] < TTL_SECONDS}
        deleted = {n: t for n, t in self._deleted.get(key, {}).items()
                   if n in names and now - t < TTL_SECONDS}
        self._created[key], self._deleted[key] = created, deleted
        pods = [dataclasses.replace(p, terminating=True) if p.name in deleted else p
                for p in indexed]
        return (*pods, *(pod for _, pod in created.values()))

    def forget(self, key: Hashable) -> None:
        self._created.pop(key, None)
        self._deleted.pop(key, None)
