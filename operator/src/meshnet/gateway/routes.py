"""Which stages serve each replica of the route now, and one route driver per replica.

A gateway outlives epochs and scaling: `meshnet up` starts a re-split route's workers on
new ports and adds or removes replicas, so a local route is looked up again in its
registry at every probe; fixed endpoints (--stage, --replica, or the stable DNS names of a
cluster route's stages) stay as they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from meshnet.api.drafter_kind import DrafterKind
from meshnet.local.registry import lookup
from meshnet.route import RouteDriver, RouteInfo, TlsFiles
from meshnet.route.route_key import RouteSecret

Endpoints = tuple[str, ...]


def fixed_replicas(groups: Sequence[Sequence[str]]) -> Callable[[], dict[str, Endpoints]]:
    """Replicas labelled by their position ("0", "1", ...), each its stages in order."""
    replicas = {str(index): tuple(group) for index, group in enumerate(groups)}
    return lambda: replicas


def local_route(name: str) -> Callable[[], dict[str, Endpoints]]:
    """The replicas `meshnet up` publishes for route `name` (RouteNotFound while none)."""
    def replicas() -> dict[str, Endpoints]:
        entry = lookup(name)
        return {str(replica["replica"]): tuple(str(s["endpoint"]) for s in replica["stages"])
                for replica in entry.get("replicas", [{"replica": 0, **entry}])}

    return replicas


class RouteHandle:
    """The driver of the route's current stages; a new one when the stages move."""

    def __init__(self, resolve: Callable[[], Endpoints], tls: TlsFiles | None = None,
                 recovery_wait: float = 15.0, drafter: DrafterKind | None = None,
                 route_key: RouteSecret | None = None) -> None:
        self._resolve = resolve
        self._tls = tls
        self._route_key = route_key
        self._recovery_wait = recovery_wait
        self._drafter = drafter  # the last stage must host it (the handshake refuses else)
        self._lock = threading.Lock()
        self._driver: RouteDriver | None = None
        self._endpoints: Endpoints = ()

    def driver(self) -> RouteDriver:
        """A driver of the stages serving now (the handshake is its first use's)."""
        endpoints = self._resolve()
        with self._lock:
            if self._driver is None or endpoints != self._endpoints:
                stale = self._driver
                self._driver = RouteDriver(list(endpoints), tls=self._tls,
                                           route_key=self._route_key,
                                           wait_seconds=self._recovery_wait,
                                           drafter=self._drafter)
                self._endpoints = endpoints
                if stale is not None:
                    # sessions still running on it keep their own channels until they end
                    threading.Timer(60.0, stale.close).start()
            return self._driver

    def check(self) -> RouteInfo:
        """Handshake every stage now: the route as it is, or the error why it is not
        servable (StageError, RouteRefused, RouteNotFound)."""
        return self.driver().connect()

    def kv_usage(self) -> float:
        """The share of the route's KV cells in use now (0..1)."""
        return self.driver().kv_usage()

    def close(self) -> None:
        with self._lock:
            if self._driver is not None:
                self._driver.close()
                self._driver = None
