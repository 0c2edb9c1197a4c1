"""Session releases that failed, retried off the request path.

A worker frees a session's slot only when it is released or when a new session needs
the slot (an idle session gives way after --evict-idle-ms). A release sent while its
stage was frozen (stopped, swapping) or unreachable would otherwise leave the session
held there for good: the slot still serves new sessions, but GetCapacity, the worker's
metrics and the Tracker count it as load. So a release that got no answer is sent
again a few times with backoff from one background thread, with asynchronous calls
(a frozen stage holds no thread), until the stage answers: released, or it holds
nothing (a restarted stage, a new incarnation). A stage still silent after the last
try is given up on (gone, or frozen so long that it is being replaced)."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from meshnet.route.errors import TRANSIENT_CODES
from meshnet.route.proto import pb
from meshnet.route.stage import StageClient

# Seconds before each try after the first failed release: about a minute in all.
RETRY_DELAYS_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
ATTEMPT_TIMEOUT_SECONDS = 5.0


@dataclass
class _Release:
    client: StageClient
    key: pb.RouteKey
    tries: int = 0  # retries sent so far


class ReleaseRetries:
    """A queue of releases to send again; thread-safe, its thread starts on first use."""

    def __init__(self, delays: Sequence[float] = RETRY_DELAYS_SECONDS,
                 attempt_timeout: float = ATTEMPT_TIMEOUT_SECONDS) -> None:
        self._delays = tuple(delays)
        self._attempt_timeout = attempt_timeout
        self._due: list[tuple[float, int, _Release]] = []  # a heap by due time
        self._in_flight = 0
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, client: StageClient, key: pb.RouteKey) -> None:
        """Sends the release of `key` to `client`'s stage again later (its first try
        failed without an answer)."""
        self._schedule(_Release(client, key))

    def pending(self) -> int:
        """Releases waiting for their next try or for its answer."""
        with self._cond:
            return len(self._due) + self._in_flight

    def _schedule(self, release: _Release) -> None:
        with self._cond:
            due = time.monotonic() + self._delays[release.tries]
            heapq.heappush(self._due, (due, next(self._order), release))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="release-retries",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, release = heapq.heappop(self._due)
                self._in_flight += 1
            self._send(release)

    def _send(self, release: _Release) -> None:
        release.tries += 1
        try:
            future = release.client.release_future(release.key, self._attempt_timeout)
        except ValueError:  # the driver closed its channel: its route is gone
            self._settle()
            return
        future.add_done_callback(lambda done: self._answered(release, done))

    def _answered(self, release: _Release, done: grpc.Future) -> None:
        # No answer (frozen, restarting, unreachable) is worth another try; any other
        # failure is an answer (ROUTE_MISMATCH, EPOCH_MISMATCH: it holds nothing of ours).
        error = done.exception()
        unanswered = isinstance(error, grpc.RpcError) and error.code().name in TRANSIENT_CODES
        if unanswered and release.tries < len(self._delays):
            self._schedule(release)
        self._settle()

    def _settle(self) -> None:
        with self._cond:
            self._in_flight -= 1


# Every session of this process retries through this one queue.
RELEASES = ReleaseRetries()
