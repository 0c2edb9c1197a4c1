"""The route driver: generations over a pipeline of shard workers, one session each
(calls may run concurrently from several threads).

The driver holds the stage clients, the settings and the route as last checked (the
handshake, meshnet.route.handshake). Each generation is a Session (meshnet.route.session)
on a snapshot of that route and a copy of the settings; its steps go through the walk of
the route's topology (meshnet.route.topology: hub, chain, loop, ring), and a session that
recovers takes a fresh snapshot for itself alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from meshnet.api.common import Topology
from meshnet.api.drafter_kind import DrafterKind
from meshnet.route.compression import BoundaryCompression
from meshnet.route.drafts import MAX_DRAFT, MAX_WINDOWS
from meshnet.route.errors import PromptTooLong, RouteError, RouteRefused, StageError
from meshnet.route.generation import Generation
from meshnet.route.handshake import RouteInfo, check_route
from meshnet.route.route_key import RouteSecret
from meshnet.route.sampling import Sampling
from meshnet.route.session import Refresh, Session, SessionSettings, vocab_client
from meshnet.route.stage import StageClient, TlsFiles
from meshnet.route.topology import REQUESTABLE, Requested, pick_topology

__all__ = ["Generation", "RouteDriver"]

INFO_TIMEOUT = 5.0  # seconds each stage has to answer the handshake's GetInfo
# How long a recovering session the stages refused a slot waits before it asks again.
SLOT_PAUSE_SECONDS = 0.5


class RouteDriver:
    """Drives generations over the stages at `endpoints`, in pipeline order."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        route_key: RouteSecret | None = None,
        max_recoveries: int = 4,
        wait_seconds: float = 60.0,
        chunk_tokens: int | None = None,
        sample_locally: bool = False,
        topology: str = "auto",
        decode_loop: bool = True,
        speculate: int = 0,
        windows: int = 1,
        drafter: DrafterKind | None = None,
        reuse_prefix: bool = True,
        boundary_compression: BoundaryCompression = BoundaryCompression.OFF,
    ) -> None:
        if topology not in REQUESTABLE:
            raise RouteError(f"topology must be one of {', '.join(REQUESTABLE)}, "
                             f"not {topology!r}")
        if not endpoints:
            raise RouteError("a route needs at least one --stage")
        # the route key, proved on every call: stages started with one serve no one else
        self.route_key = route_key
        self.clients = [StageClient(endpoint, tls, route_key=route_key) for endpoint in endpoints]
        self.max_recoveries = max_recoveries
        self.wait_seconds = wait_seconds
        self.chunk_tokens = chunk_tokens
        self.sample_locally = sample_locally
        self.topology: Requested = REQUESTABLE[REQUESTABLE.index(topology)]  # str -> its word
        self.decode_loop = decode_loop
        self.speculate = _draft_cap(speculate)
        self.windows = _window_cap(windows)
        self.drafter = drafter  # the drafter the last stage must host (None: none asked)
        # Start sessions from the stages' cached prefixes where the route has a prefix
        # cache (off: every prefill is cold, on the cache's grid all the same).
        self.reuse_prefix = reuse_prefix
        # What the hub's legs (stage -> driver -> next stage) do to boundaries: packed only
        # where a stage takes the encoding and is not on loopback (meshnet.route.compression).
        self.boundary_compression = boundary_compression
        self._lock = threading.Lock()
        self._route: RouteInfo | None = None

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> RouteDriver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the route ------------------------------------------------------------------

    @property
    def route(self) -> RouteInfo:
        with self._lock:
            if self._route is None:
                self._route = self._handshake(wait=0.0)
            return self._route

    def connect(self, wait: float = 0.0) -> RouteInfo:
        """GetInfo on every stage and check them as one route (waiting up to `wait`
        seconds for stages that are starting or still on another epoch)."""
        with self._lock:
            self._route = self._handshake(wait)
            return self._route

    def _handshake(self, wait: float) -> RouteInfo:
        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            try:
                answers = [(c.endpoint, c.info(timeout=INFO_TIMEOUT)) for c in self.clients]
                keyed = [endpoint for endpoint, info in answers if info.requires_route_key]
                if keyed and self.route_key is None:
                    raise RouteRefused([f"stage {', '.join(keyed)} serves only holders of the "
                                        "route key: pass its file (--route-key-file)"])
                route = replace(check_route(answers, self.drafter),
                                boundary_compression=self.boundary_compression)
                if self.topology in ("chain", "ring") and not route.chained:
                    raise RouteRefused([f"topology {self.topology} needs every stage but the "
                                        "last started with --next-stage"])
                if self.topology == "ring" and not route.ringed:
                    raise RouteRefused(["topology ring needs the first stage subscribed at the "
                                        "route's last stage (--ring-last)"])
                return route
            except (StageError, RouteError):
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def settings(self, speculate: int | None = None, windows: int | None = None,
                 cache_salt: bytes = b"") -> SessionSettings:
        """The settings a session started now runs with (`speculate`, `windows`: None,
        the driver's)."""
        return SessionSettings(
            topology=self.topology, decode_loop=self.decode_loop,
            sample_locally=self.sample_locally, chunk_tokens=self.chunk_tokens,
            max_recoveries=self.max_recoveries, wait_seconds=self.wait_seconds,
            speculate=self.speculate if speculate is None else _draft_cap(speculate),
            windows=self.windows if windows is None else _window_cap(windows),
            reuse_prefix=self.reuse_prefix, cache_salt=cache_salt,
        )

    def topology_of(self, route: RouteInfo) -> Topology:
        """How a generation started now goes through `route`: ring, chain or hub."""
        settings = self.settings()
        return pick_topology(route, settings.topology, loop=settings.loop)

    def kv_usage(self) -> float:
        """The route's KV-cache use, 0..1: the fullest stage's share of its cells in use
        (every session holds cells on every stage, so the fullest one bounds the route)."""
        usage = 0.0
        for client in self.clients:
            capacity = client.capacity()
            if capacity.kv_tokens_total > 0:
                used = capacity.kv_tokens_total - capacity.kv_tokens_free
                usage = max(usage, used / capacity.kv_tokens_total)
        return usage

    def _vocab_client(self) -> StageClient:
        return vocab_client(self.clients, self.route)

    def tokenize(self, text: str, literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """The prompt's tokens, none of them a control token made from the byte ranges in
        `literal`; PromptTooLong when the stage finds they cannot fit its context (it
        refuses such text, often from its bytes alone, before tokenizing)."""
        try:
            return self._vocab_client().tokenize(text, add_special=True, literal=literal)
        except StageError as exc:
            if exc.reason != "CONTEXT_OVERFLOW":
                raise
            n_ctx = exc.metadata.get("n_ctx", "")
            counted = exc.metadata.get("n_tokens", "")
            raise PromptTooLong(int(counted) if counted.isdigit() else None,
                                int(n_ctx) if n_ctx.isdigit() else self.route.n_ctx) from None

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._vocab_client().detokenize(tokens)

    # -- generation -----------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 64,
        sampling: Sampling | None = None,
        stop_at_eos: bool = True,
        on_token: Callable[[int], None] | None = None,
        speculate: int | None = None,
        windows: int | None = None,
        refresh: Refresh | None = None,
        cache_salt: bytes = b"",
    ) -> Generation:
        """Prefills `prompt` (text or token ids) and decodes up to `max_tokens`.
        `speculate`: draft up to that many tokens per step (prompt lookup, verified
        exactly; None: the driver's default, 0: off); only where every stage can discard.
        `windows`: a decode loop keeps up to that many verify windows in flight
        (pipelined speculation; None: the driver's default, 1: one at a time).
        `refresh`: where a session that recovers goes on (None: these stages, once they
        answer again within the driver's wait). `cache_salt`: the tenant's; the stages
        reuse only prefixes computed for the same salt (b"": the route's shared cache)."""
        sampling = sampling or Sampling()
        route = self.route
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise RouteError("the prompt is empty")
        if len(prompt_ids) > route.n_ctx:
            raise PromptTooLong(len(prompt_ids), route.n_ctx)
        session = Session(self.clients, route, self.settings(speculate, windows, cache_salt),
                          refresh or self.refresh, prompt_ids, sampling)
        try:
            result = session.generate(max_tokens, stop_at_eos, on_token)
        finally:
            # every ending frees the session on every stage: done, failed, or stopped by
            # an exception from on_token (a client that went away)
            session.release()
        result.text = session.detokenize(result.tokens)
        return result

    def refresh(self, wait: float, refused: bool = False,
                ) -> tuple[Sequence[StageClient], RouteInfo]:
        """These stages, once they answer as one route again (a recovering session's);
        `refused`: they refused the session a slot, so first a pause while their
        sessions go on (at most `wait`)."""
        if refused:
            time.sleep(min(wait, SLOT_PAUSE_SECONDS))
        return self.clients, self.connect(wait)


def _window_cap(windows: int) -> int:
    if not 1 <= windows <= MAX_WINDOWS:
        raise RouteError(f"speculation keeps 1..{MAX_WINDOWS} windows in flight, not {windows}")
    return windows


def _draft_cap(speculate: int) -> int:
    if not 0 <= speculate <= MAX_DRAFT:
        raise RouteError(f"speculate drafts 0..{MAX_DRAFT} tokens per step, not {speculate}")
    return speculate
