"""One generation's session on a route: the history every stage holds, the walk of the
route's topology that feeds it, and recovery.

A session runs on its own snapshot of the route (the handshake it started with) and its
own copy of the driver's settings. On CACHE_MISS, EPOCH_MISMATCH, ENGINE_FAILURE, a
restarted chain stage or a worker that went away, it frees itself on every stage, takes
a fresh snapshot from `refresh`, and re-prefills the whole history under a new session
id; positional seeding keeps the output identical. Only this session's snapshot changes:
the other sessions running on the route keep theirs until they recover themselves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.route.drafts import MAX_DRAFT, DraftLength, PromptLookup
from meshnet.route.errors import TRANSIENT_CODES, RecoveryFailed, RouteError, StageError
from meshnet.route.generation import Generation
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.release_retry import RELEASES
from meshnet.route.requests import Answer
from meshnet.route.sampling import Sampling, sample
from meshnet.route.speculation import speculated
from meshnet.route.stage import StageClient
from meshnet.route.topology import Topology
from meshnet.route.topology.walk import Walk, walk_for

RELEASE_TIMEOUT_SECONDS = 5.0
# The widest step whose rows compute exactly as one-token steps (a verification step of
# MAX_DRAFT drafts; the CPU lane's batch-invariant kernels).
EXACT_ROWS = MAX_DRAFT + 1

# Waits up to its argument's seconds for a route to answer as one route again; returns the
# stages to go on with and their snapshot: the same stages, or (a fleet's gateway) another
# replica's of the same epoch, whose output is the same.
Refresh = Callable[[float], tuple[Sequence[StageClient], RouteInfo]]


@dataclass(frozen=True)
class SessionSettings:
    """The driver's settings as a session runs with them: set when it starts, so that a
    change on the driver reaches the sessions started after it only."""

    topology: Topology = Topology.AUTO  # asked for; the walk is picked per snapshot
    decode_loop: bool = True
    sample_locally: bool = False
    chunk_tokens: int | None = None
    max_recoveries: int = 4
    wait_seconds: float = 60.0
    speculate: int = 0  # the longest draft (0: off)
    windows: int = 1  # verify windows a decode loop keeps in flight (pipelined speculation)

    @property
    def loop(self) -> bool:
        """The first stage may decode by itself: the decode loop is on and the last stage
        samples."""
        return self.decode_loop and not self.sample_locally


class Session:
    """One generation: what every stage holds of it and how it is fed."""

    def __init__(self, clients: Sequence[StageClient], route: RouteInfo,
                 settings: SessionSettings, refresh: Refresh, prompt_ids: list[int],
                 sampling: Sampling) -> None:
        self.clients = tuple(clients)
        self.route = route
        self.walk: Walk = walk_for(route, settings)
        self.settings = settings
        self._refresh = refresh
        self.sampling = sampling
        self.answer = Answer(sampling, settings.sample_locally)
        self.history: list[int] = []  # tokens every stage holds (after a successful step)
        self.step_sizes: list[int] = []  # how the history was fed, step by step
        self.session_id = uuid.uuid4().hex
        self.result = Generation(session_id=self.session_id, prompt_tokens=list(prompt_ids))
        self.result.speculate = settings.speculate if route.can_discard else 0
        self.result.windows = pipelined_windows(settings.windows, self.result.speculate,
                                                route.discard_depth)
        self.engine_seconds = 0.0  # every answered step's engine time, over its stages

    # -- a generation -----------------------------------------------------------------

    def generate(self, max_tokens: int, stop_at_eos: bool,
                 on_token: Callable[[int], None] | None) -> Generation:
        """Prefills the prompt and decodes up to `max_tokens` (fewer at a stop id or the
        end of the context); the result has no text yet."""
        result, route = self.result, self.route
        prompt_ids = result.prompt_tokens
        result.topology = self.walk.topology.value
        result.decode_loop = self.walk.loops
        started = time.perf_counter()
        token = self.step_with_recovery(prompt_ids)
        result.prefill_seconds = time.perf_counter() - started
        decode_started = time.perf_counter()
        engine_before = self.engine_seconds
        stop_ids = set(route.eos_token_ids) if stop_at_eos else set()
        further = min(max_tokens - 1, route.n_ctx - len(self.history))
        result.tokens.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids:
            result.stop_reason = "eos"
        elif further > 0:
            # A walk that loops speculates inside the loop (no driver round trip per
            # step); else the session verifies the drafts itself.
            tokens = (speculated(self, token, further, stop_ids,
                                 *drafter([*prompt_ids, token], result.speculate))
                      if result.speculate and not self.walk.loops else
                      self.decoded(token, further, stop_ids, drafts=result.speculate))
            for next_token in tokens:
                result.tokens.append(next_token)
                if on_token is not None:
                    on_token(next_token)
                if next_token in stop_ids:
                    result.stop_reason = "eos"
                    break
        if result.stop_reason != "eos" and len(result.tokens) < max_tokens:
            result.stop_reason = "context"
        result.decode_seconds = time.perf_counter() - decode_started
        result.decode_engine_seconds = self.engine_seconds - engine_before
        return result

    def decoded(self, token: int, count: int, stop_ids: set[int],
                drafts: int = 0) -> Iterator[int]:
        """Up to `count` tokens after `token` (stops after a stop id), recovering as the
        steps do; a walk that loops drafts up to `drafts` tokens per step."""
        produced = 0
        while produced < count:
            pending = [token]  # fed to the route, not yet acknowledged
            try:
                for sampled in self.walk.decode(self, token, count - produced, stop_ids,
                                                pending, drafts):
                    produced += 1
                    token = sampled
                    yield sampled
                return
            except StageError as exc:
                self.recover(exc)
                token = self.steps_with_recovery([*self.forget_history(), pending])
                produced += 1
                yield token
                if token in stop_ids:
                    return

    # -- the history --------------------------------------------------------------------

    def key(self) -> pb.RouteKey:
        return pb.RouteKey(route_id=self.route.route_id, epoch=self.route.epoch,
                           session_id=self.session_id)

    def step_with_recovery(self, tokens: list[int]) -> int:
        """Feeds `tokens` after the history; returns the token sampled after the last."""
        return self.steps_with_recovery([tokens])

    def steps_with_recovery(self, steps: list[list[int]]) -> int:
        """Feeds `steps` in turn after the history; returns the token sampled after the
        last. A failure re-prefills the whole history under a new session first."""
        token = -1
        while True:
            try:
                while steps:
                    token = self.walk.feed(self, steps[0], len(self.history))
                    self.remember(steps.pop(0))
                return token
            except StageError as exc:
                self.recover(exc)
                steps = self.forget_history() + steps

    def remember(self, step: list[int]) -> None:
        self.history.extend(step)
        self.step_sizes.append(len(step))

    def forget_history(self) -> list[list[int]]:
        """The history as steps to feed a new session, so that the re-prefilled state is
        bit for bit the state the session had: the steps as they were fed, except that
        steps of up to EXACT_ROWS tokens go together up to that width (each row of such a
        step computes as alone on the CPU lane's batch-invariant kernels). One prefill of
        it all would compute the decoded tokens' KV in a wide step, which differs in the
        last bits and can flip a later greedy token. A model whose numerics depend on
        step boundaries (RouteInfo.step_sensitive) gets its steps exactly as fed."""
        history, sizes = self.history, self.step_sizes
        self.history, self.step_sizes = [], []
        joinable = 1 if self.route.step_sensitive else EXACT_ROWS
        steps: list[list[int]] = []
        start = 0
        for size in sizes:
            step = history[start:start + size]
            start += size
            if steps and len(steps[-1]) + size <= joinable:
                steps[-1].extend(step)
            else:
                steps.append(step)
        return steps

    def recover(self, cause: StageError) -> None:
        """Frees the session, waits for the route and goes on under a new session id on
        the fresh snapshot. Raises `cause` when it is not recoverable, and RecoveryFailed
        past `max_recoveries`."""
        if not cause.recoverable:
            raise cause
        result = self.result
        result.recoveries += 1
        result.recovery_reasons.append(f"{cause.endpoint}: {cause.reason or cause.code}")
        if result.recoveries > self.settings.max_recoveries:
            raise RecoveryFailed(
                f"gave up after {self.settings.max_recoveries} recoveries: "
                + "; ".join(result.recovery_reasons)
            ) from cause
        self.release()
        clients, self.route = self._refresh(self.settings.wait_seconds)
        self.clients = tuple(clients)
        self.walk = walk_for(self.route, self.settings)
        self.session_id = uuid.uuid4().hex
        result.session_id = self.session_id

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`, by the stage that holds the vocabulary on the stages the
        session runs on now."""
        return vocab_client(self.clients, self.route).detokenize(tokens)

    def release(self) -> None:
        """Frees the session on every stage. A stage that does not answer within
        RELEASE_TIMEOUT_SECONDS (frozen, restarting) gets the release again later, off
        this thread (meshnet.route.release_retry): else it would count the session as
        held until a new session needs its slot."""
        key = self.key()
        for client in self.clients:
            try:
                client.release(key, timeout=RELEASE_TIMEOUT_SECONDS)
            except StageError as exc:
                if exc.code in TRANSIENT_CODES:
                    RELEASES.add(client, key)

    # -- what the walks share -------------------------------------------------------------

    def answered(self, response: pb.ForwardResponse) -> pb.ForwardResponse:
        self.engine_seconds += sum(hop.engine_micros for hop in response.chain) * 1e-6
        return response

    def take_output(self, response: pb.ForwardResponse, position: int) -> int:
        """The token the last stage sampled, or sampled here from its logits."""
        if response.sampled_tokens:
            return int(response.sampled_tokens[0])
        logits = np.asarray(response.rows[0].logits, dtype=np.float32)
        return sample(logits, self.sampling, position)

    def count_drafts(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.result.draft_tokens += drafted
            self.result.accepted_draft_tokens += accepted
            self.result.speculative_steps += 1


def pipelined_windows(windows: int, drafts: int, discard_depth: int) -> int:
    """Verify windows a speculating loop may keep in flight: one rejection drops all but
    the oldest window's first token on every stage at once, so where the stages can drop
    only `discard_depth` positions, no more windows of `drafts` + 1 rows than fit."""
    if drafts <= 0:
        return 1
    if discard_depth > 0:
        windows = min(windows, (discard_depth + 1) // (drafts + 1))
    return max(1, windows)


def drafter(context: list[int], cap: int) -> tuple[PromptLookup, DraftLength]:
    """Prompt lookup over `context` and a draft length that starts at `cap` and adapts."""
    lookup = PromptLookup()
    lookup.extend(context)
    return lookup, DraftLength(start=cap, most=cap)


def vocab_client(clients: Sequence[StageClient], route: RouteInfo) -> StageClient:
    """The client of the first stage that holds the model's vocabulary (it tokenizes)."""
    for client, stage in zip(clients, route.stages, strict=True):
        if stage.has_vocab:
            return client
    raise RouteError("no stage can tokenize")
