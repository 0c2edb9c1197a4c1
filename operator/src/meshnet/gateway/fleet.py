"""The replicas of a route behind one gateway: which are ready (each handshaken by the
probe, taken out at once when a session loses one of its stages), how many sessions each
runs, and where a session goes when it starts or when its replica dies.

Every replica serves the same epoch of the same route, so a session that moves to another
replica is re-prefilled there (the route driver's recovery, meshnet.route.session) and
goes on with the same tokens. A stage refuses a session beyond its slots
(CAPACITY_EXHAUSTED), so a moving session goes only where a slot is free, and waits for
one (a session ending on another replica, or its own replica answering again) within the
gateway's --recovery-wait. Methods are called from the event loop and from generation
threads: the lock guards the replicas and their counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from meshnet.api.drafter_kind import DrafterKind
from meshnet.errors import MeshnetError
from meshnet.gateway.routes import Endpoints, RouteHandle
from meshnet.gateway.spread import Candidate, RecentPrompts, pick
from meshnet.route import RouteDriver, RouteInfo, TlsFiles
from meshnet.route.route_key import RouteSecret

# The route's replicas by label ("0", "1", ...): each one's stage endpoints in order.
Replicas = dict[str, Endpoints]
# How long a session whose replica refused it a slot the fleet counted free (sessions of
# another gateway or client hold it) waits before it asks again, unless a slot frees first.
REFUSED_PAUSE_SECONDS = 0.5


class NoSlot(MeshnetError):
    """A moving session found no replica to go on on within the wait."""


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
    drafter: DrafterKind | None = None  # the one each replica's last stage must host
    route_key: RouteSecret | None = None  # proved on every call to the stages
    changed: Callable[[], None] = lambda: None  # a replica was taken out or came back
    replicas: dict[str, Replica] = field(default_factory=dict)
    problem: str = ""  # why the replicas could not be resolved ("" when they were)
    moves: int = 0  # sessions finished on another replica than they started on
    _endpoints: Replicas = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # notified when a slot may have come free: a session ended or moved, a replica came back
    _freed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._freed = threading.Condition(self._lock)

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
                        self._resolver(name), self.tls, self.recovery_wait, self.drafter,
                        self.route_key))
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
            self._freed.notify_all()
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
            self._freed.notify_all()

    def relocate(self, current: Replica, lost: str, wait: float, refused: bool = False,
                 ) -> tuple[Replica, RouteDriver, RouteInfo]:
        """Where a session that lost `current`'s stages (or their state) goes on, its slot
        moved with it: the first, within `wait` seconds, of another ready replica with a
        free slot (`current` is taken out meanwhile) and a replica that answers a handshake
        again (`current` itself: a restarted stage, a cache miss; another one only with a
        free slot). Meanwhile it waits for a session to end. `refused`: `current`'s stages
        refused the session a slot although the fleet counted one free (sessions of another
        gateway or client hold it): `current` stays in and is asked again after a pause.
        Raises NoSlot, with the reason, when nothing came within `wait`."""
        deadline = time.monotonic() + wait
        if refused:
            self._await_slot(deadline, REFUSED_PAUSE_SECONDS)
        else:
            self.lost(current, lost)
        delay = 0.05
        failure: Exception | None = None
        while True:
            target = self._reserve_free_slot(current)
            if target is not None:
                driver = target.handle.driver()
                try:
                    info = driver.connect(0.0)
                except (MeshnetError, OSError) as exc:
                    self._reserve(target, current)  # the slot goes back; try again at once
                    failure = exc
                    self.take_out(target, str(exc))  # (never asked again within this loop)
                    continue
                self._put_in(target, info)
                self._moved(target)
                return target, driver, info
            for replica in self._down(current):
                driver = replica.handle.driver()
                try:
                    info = driver.connect(0.0)
                except (MeshnetError, OSError) as exc:
                    failure = exc
                    self.lost(replica, str(exc))
                    continue
                self._put_in(replica, info)
                if replica is current:
                    return replica, driver, info
                if self._reserve(current, replica, only_free=True):
                    self._moved(replica)
                    return replica, driver, info
            if time.monotonic() + delay > deadline:
                raise NoSlot(_no_slot(current, lost, wait, refused, failure))
            self._await_slot(deadline, delay)
            delay = min(delay * 2, 1.0)

    def switch(self, current: Replica, lost: str, wait: float,
               ) -> tuple[Replica, RouteDriver, RouteInfo] | None:
        """Where a session whose replica failed it before it began (its first stage refused
        to tokenize: it just died) goes: as `relocate`, waiting for a free slot on another
        ready replica; None, with `current` left in, when no other replica is ready (it is
        the route's last: the request is answered as the route is)."""
        with self._lock:
            others = any(r.info is not None for r in self.replicas.values() if r is not current)
        if not others:
            return None
        return self.relocate(current, lost, wait)

    def close(self) -> None:
        for replica in self.known():
            replica.handle.close()

    def _reserve_free_slot(self, current: Replica) -> Replica | None:
        """Another ready replica with a free slot, the session's slot moved there."""
        with self._lock:
            free = [r for r in self.replicas.values()
                    if r is not current and r.info is not None and r.free > 0]
            ranked = _ranked(free, current.name)
            if not ranked:
                return None
            self._shift(current, ranked[0])
            return ranked[0]

    def _reserve(self, source: Replica, target: Replica, only_free: bool = False) -> bool:
        """Moves a session's slot from `source` to `target` (only to a free one if asked)."""
        with self._lock:
            if only_free and target.free <= 0:
                return False
            self._shift(source, target)
            return True

    def _shift(self, source: Replica, target: Replica) -> None:
        source.running -= 1
        target.running += 1
        self._freed.notify_all()

    def _moved(self, target: Replica) -> None:
        with self._lock:
            target.sessions += 1
            self.moves += 1

    def _down(self, current: Replica) -> list[Replica]:
        """The replicas a moving session asks whether they answer again: those taken out,
        and its own."""
        with self._lock:
            return [r for r in self.replicas.values() if r.info is None or r is current]

    def _await_slot(self, deadline: float, longest: float) -> None:
        """Sleeps up to `longest` seconds (never past `deadline`), less when a slot frees."""
        with self._lock:
            self._freed.wait(max(0.0, min(longest, deadline - time.monotonic())))


def _no_slot(current: Replica, lost: str, wait: float, refused: bool,
             failure: Exception | None) -> str:
    """Why a moving session found nowhere to go on."""
    why = (f"replica {current.name} refused it a session slot (CAPACITY_EXHAUSTED)" if refused
           else lost)
    tail = f"; last: {failure}" if failure is not None else ""
    return (f"{why}, and within {wait:.1f}s no session slot came free on another replica and"
            f" replica {current.name} did not come back{tail}")


def _choose(ready: Sequence[Replica], key: str, prompt: str = "") -> Replica | None:
    """spread.pick over `ready`; when every slot is taken (a replica just went: its
    sessions wait for slots), the least loaded one: its stages may refuse the new session
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


