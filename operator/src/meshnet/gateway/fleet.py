"""The replicas of a route behind one gateway: which are ready (each handshaken by the
probe, taken out at once when a session loses one of its stages), how many sessions each
runs, and where a session goes when it starts or when its replica dies.

Every replica serves the same epoch of the same route, so a session that moves to another
replica is re-prefilled there (the route driver's recovery, meshnet.route.session) and
goes on with the same tokens. Methods are called from the event loop and from generation
threads: the lock guards the replicas and their counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from meshnet.errors import MeshnetError
from meshnet.gateway.routes import Endpoints, RouteHandle
from meshnet.gateway.spread import Candidate, RecentPrompts, pick
from meshnet.route import RouteDriver, RouteInfo, TlsFiles

# The route's replicas by label ("0", "1", ...): each one's stage endpoints in order.
Replicas = dict[str, Endpoints]


@dataclass
class Replica:
    name: str
    handle: RouteHandle
    info: RouteInfo | None = None  # as of its last handshake; None: not servable
    problem: str = "not checked yet"
    running: int = 0  # sessions on it now
    sessions: int = 0  # sessions it has taken, started or moved here
    recent: RecentPrompts = field(default_factory=RecentPrompts)  # the prompts it served last

    @property
    def free(self) -> int:
        return (self.info.n_slots - self.running) if self.info is not None else 0


@dataclass
class Fleet:
    resolve: Callable[[], Replicas]
    tls: TlsFiles | None = None
    recovery_wait: float = 15.0
    drafter: str = ""
    changed: Callable[[], None] = lambda: None  # a replica was taken out or came back
    replicas: dict[str, Replica] = field(default_factory=dict)
    problem: str = ""  # why the replicas could not be resolved ("" when they were)
    moves: int = 0  # sessions finished on another replica than they started on
    _endpoints: Replicas = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- which replicas there are ---------------------------------------------------------

    def refresh_replicas(self) -> list[Replica]:
        """Resolves the replicas anew (a scale or an epoch change); the current ones."""
        try:
            endpoints, self.problem = self.resolve(), ""
        except MeshnetError as exc:
            endpoints, self.problem = {}, str(exc)
        with self._lock:
            self._endpoints = endpoints
            for name in [n for n in self.replicas if n not in endpoints]:
                gone = self.replicas.pop(name)
                # its sessions end with its stages, or move; their drivers keep their channels
                closing = threading.Timer(60.0, gone.handle.close)
                closing.daemon = True  # never holds the gateway's exit
                closing.start()
            for name in endpoints:
                if name not in self.replicas:
                    self.replicas[name] = Replica(name, RouteHandle(
                        self._resolver(name), self.tls, self.recovery_wait, self.drafter))
            return list(self.replicas.values())

    def _resolver(self, name: str) -> Callable[[], Endpoints]:
        return lambda: self._endpoints.get(name, ())

    def check(self, replica: Replica) -> RouteInfo | None:
        """Handshakes every stage of `replica` (blocking): in when it answers, else out."""
        try:
            info = replica.handle.check()
        except (MeshnetError, OSError) as exc:
            self.take_out(replica, str(exc))
            return None
        self._put_in(replica, info)
        return info

    def _put_in(self, replica: Replica, info: RouteInfo) -> None:
        with self._lock:
            was = replica.info
            replica.info, replica.problem = info, ""
        if was is None or was.n_slots != info.n_slots:
            self.changed()

    def lost(self, replica: Replica, problem: str) -> None:
        """A session lost `replica`'s stages (or their state): taken out at once while
        another replica is ready; the last one stays in until the probe's handshake finds
        it down (as a single route is answered by the probe's last finding: a restarted
        stage serves the next request without waiting for a probe)."""
        with self._lock:
            others = any(r.info is not None for r in self.replicas.values() if r is not replica)
        if others:
            self.take_out(replica, problem)

    def take_out(self, replica: Replica, problem: str) -> None:
        """No new session goes to `replica` until a handshake finds it whole again."""
        with self._lock:
            was = replica.info
            replica.info, replica.problem = None, problem
        if was is not None:
            self.changed()

    # -- what the gateway reads ---------------------------------------------------------

    def known(self) -> list[Replica]:
        with self._lock:
            return list(self.replicas.values())

    def ready(self) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas.values() if r.info is not None]

    def info(self) -> RouteInfo | None:
        """The route as a ready replica answered (every replica serves the same epoch)."""
        ready = self.ready()
        return ready[0].info if ready else None

    def slots(self) -> int:
        return sum(r.info.n_slots for r in self.ready() if r.info is not None)

    def scaled_to_zero(self) -> bool:
        """The route has no replica (resolved as such, not unresolvable)."""
        with self._lock:
            return not self.problem and not self.replicas

    def why_unavailable(self, route: str) -> str:
        if self.problem:
            return f"route {route} is not servable: {self.problem}"
        with self._lock:
            replicas = list(self.replicas.values())
        if not replicas:
            return f"route {route} is scaled to zero replicas"
        return f"route {route} is not servable: " + "; ".join(
            f"replica {r.name}: {r.problem}" for r in replicas)

    # -- where sessions run ---------------------------------------------------------------

    def admit(self, key: str, prompt: str = "") -> Replica | None:
        """A ready replica for a new session of conversation `key` whose prompt reads
        `prompt` (spread.prompt_text), its slot taken: the one with the most free slots,
        among equals the one that served the longest start of `prompt`; None when none is
        ready."""
        with self._lock:
            ready = [r for r in self.replicas.values() if r.info is not None]
            chosen = _choose(ready, key, prompt)
            if chosen is not None:
                chosen.running += 1
                chosen.sessions += 1
                chosen.recent.remember(prompt)
            return chosen

    def leave(self, replica: Replica) -> None:
        with self._lock:
            replica.running -= 1

    def relocate(self, current: Replica, lost: str, wait: float,
                 ) -> tuple[Replica, RouteDriver, RouteInfo]:
        """Where a session that lost `current`'s stages (or their state) goes on: another
        ready replica when there is one (`current` is taken out meanwhile), else whichever
        replica answers a handshake first within `wait` seconds, `current` included (a
        restarted stage, a cache miss). Its slot moves with it. Raises the last failure."""
        self.lost(current, lost)
        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            with self._lock:
                others = [r for r in self.replicas.values()
                          if r is not current and r.info is not None]
                order = _ranked(others, current.name) or list(self.replicas.values())
            failure: Exception | None = None
            for replica in order:
                driver = replica.handle.driver()
                try:
                    info = driver.connect(0.0)
                except (MeshnetError, OSError) as exc:
                    failure = exc
                    self.lost(replica, str(exc))
                    continue
                self._put_in(replica, info)
                self._move(current, replica)
                return replica, driver, info
            if time.monotonic() + delay > deadline:
                if failure is not None:
                    raise failure
                raise MeshnetError(f"no replica of the route answered within {wait:.0f}s: "
                                   f"{lost}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def switch(self, current: Replica, lost: str) -> Replica | None:
        """Another ready replica for a session whose replica failed it before it began
        (its first stage refused to tokenize: it just died), its slot moved there, with
        `current` taken out; None when no other replica is ready."""
        self.lost(current, lost)
        with self._lock:
            others = [r for r in self.replicas.values() if r is not current and r.info is not None]
            ranked = _ranked(others, current.name)
        if not ranked:
            return None
        self._move(current, ranked[0])
        return ranked[0]

    def close(self) -> None:
        for replica in self.known():
            replica.handle.close()

    def _move(self, source: Replica, target: Replica) -> None:
        with self._lock:
            source.running -= 1
            target.running += 1
            if target is not source:
                target.sessions += 1
                self.moves += 1


def _choose(ready: Sequence[Replica], key: str, prompt: str = "") -> Replica | None:
    """spread.pick over `ready`; when every slot is taken (a replica just went and its
    sessions moved), the least loaded one: its stages may refuse the session
    (CAPACITY_EXHAUSTED), a 503 for it, rather than every request waiting."""
    by_name = {r.name: r for r in ready}
    chosen = pick([Candidate(r.name, r.free, r.recent.shared(prompt)) for r in ready], key)
    if chosen is not None:
        return by_name[chosen.name]
    return max(ready, key=lambda r: r.free, default=None)


def _ranked(replicas: Sequence[Replica], key: str) -> list[Replica]:
    """`replicas` in the order a moving session tries them: the most free slots first."""
    first = _choose(replicas, key)
    return [] if first is None else [first, *sorted(
        (r for r in replicas if r is not first), key=lambda r: -r.free)]


