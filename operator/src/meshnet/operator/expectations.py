"""Children the operator created, deleted or stamped draining whose watch events have not
reached the indices yet (controller-runtime's "expectations"): the planner sees them as
done, so a reconcile that races its own writes neither creates twice, drains twice
(restarting the drain's clock) nor reports twice; and the watch's events that show the
planner nothing new (a pod we created, as created; a pod as it was last seen, which a
re-opened watch or a re-list replays; one of several pods we deleted, while others are
still going) are known as such."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Mapping
from typing import Any

from meshnet.reconcile.route import ObservedPod, observe_pod

TTL_SECONDS = 60.0  # an expectation the watch never confirms is dropped after this


class Expectations:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._created: dict[Hashable, dict[str, tuple[float, ObservedPod]]] = {}
        self._deleted: dict[Hashable, dict[str, float]] = {}
        self._draining: dict[Hashable, dict[str, tuple[float, str]]] = {}  # name -> stamp
        self._seen: dict[Hashable, dict[str, ObservedPod]] = {}  # as each pod was last seen

    def created(self, key: Hashable, pod: Mapping[str, Any]) -> None:
        observed = observe_pod(pod)
        if observed is not None:
            self._created.setdefault(key, {})[observed.name] = (self._clock(), observed)

    def unchanged(self, key: Hashable, pod: Mapping[str, Any]) -> bool:
        """True when `pod` shows the planner nothing new: one we created, still as the API
        server returned it to us, or as this was last asked about it. Remembers it."""
        observed = observe_pod(pod)
        if observed is None:
            return False
        seen = self._seen.setdefault(key, {})
        expected = self._created.get(key, {}).get(observed.name)
        same = seen.get(observed.name, expected[1] if expected else None) == observed
        seen[observed.name] = observed
        return same

    def deleted(self, key: Hashable, name: str) -> None:
        self._deleted.setdefault(key, {})[name] = self._clock()

    def undeleted(self, key: Hashable, name: str) -> None:
        """The delete of `name` failed: it is not going after all."""
        self._deleted.get(key, {}).pop(name, None)

    def draining(self, key: Hashable, name: str, since: str) -> None:
        """We stamped pod `name` draining since `since` (its annotation)."""
        self._draining.setdefault(key, {})[name] = (self._clock(), since)

    def gone(self, key: Hashable, name: str) -> bool:
        """Record that pod `name` is gone; True when we deleted it and others we deleted
        are still going (a new epoch starts only once the last one is gone)."""
        self._seen.get(key, {}).pop(name, None)
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
        stamps = {n: v for n, v in self._draining.get(key, {}).items()
                  if n in names and now - v[0] < TTL_SECONDS}
        for pod in indexed:
            if pod.draining_since is not None:
                stamps.pop(pod.name, None)  # the watch shows a stamp: it is the truth
        self._created[key], self._deleted[key], self._draining[key] = created, deleted, stamps
        pods = [dataclasses.replace(p, terminating=p.terminating or p.name in deleted,
                                    draining_since=p.draining_since
                                    or stamps.get(p.name, (0.0, None))[1])
                for p in indexed]
        return (*pods, *(pod for _, pod in created.values()))

    def forget(self, key: Hashable) -> None:
        self._created.pop(key, None)
        self._deleted.pop(key, None)
        self._draining.pop(key, None)
        self._seen.pop(key, None)
