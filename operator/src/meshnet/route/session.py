"""One generation's session on a route: the history every stage holds, the walk of the
route's topology that feeds it, and recovery.

A session runs on its own snapshot of the route (the handshake it started with) and its
own copy of the driver's settings. On CACHE_MISS, EPOCH_MISMATCH, ENGINE_FAILURE, a
restarted chain stage or a worker that went away, it frees itself on every stage, takes
a fresh snapshot from `refresh`, and re-prefills the whole history under a new session
id; positional seeding keeps the output identical. Only this session's snapshot changes:
the other sessions running on the route keep theirs until they recover themselves. A
recovered session that the stages refuse a slot (CAPACITY_EXHAUSTED: it went where other
sessions hold every one) waits for one, within `wait_seconds` of the loss.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from meshnet.route.drafts import DraftLength, PromptLookup
from meshnet.route.errors import TRANSIENT_CODES, RecoveryFailed, RouteError, StageError
from meshnet.route.exactness import plan_speculation
from meshnet.route.generation import Generation
from meshnet.route.handshake import RouteInfo
from meshnet.route.prefix import first_try, next_try
from meshnet.route.proto import pb
from meshnet.route.release_retry import RELEASES
from meshnet.route.requests import Answer, Reuse
from meshnet.route.sampling import Sampling
from meshnet.route.stage import StageClient
from meshnet.route.step_context import StepContext, StepCounts
from meshnet.route.topology import Requested
from meshnet.route.topology.choose import walk_for
from meshnet.route.topology.walk import Walk

RELEASE_TIMEOUT_SECONDS = 5.0

# Waits up to its first argument's seconds for a route to answer as one route again;
# returns the stages to go on with and their snapshot: the same stages, or (a fleet's
# gateway) another replica's of the same epoch, whose output is the same. Its second
# argument, `refused`: the stages answer but refused the session a slot, so it waits for
# a session to end there (or goes where a slot is free) rather than for them to come back.
Refresh = Callable[[float, bool], tuple[Sequence[StageClient], RouteInfo]]


@dataclass(frozen=True)
class SessionSettings:
    """The driver's settings as a session runs with them: set when it starts, so that a
    change on the driver reaches the sessions started after it only."""

    topology: Requested = "auto"  # asked for; the walk is picked per snapshot
    decode_loop: bool = True
    sample_locally: bool = False
    chunk_tokens: int | None = None
    max_recoveries: int = 4
    wait_seconds: float = 60.0
    speculate: int = 0  # the longest draft (0: off)
    windows: int = 1  # verify windows a decode loop keeps in flight (pipelined speculation)
    reuse_prefix: bool = True  # start from the stages' cached prefix where the route has one
    cache_salt: bytes = b""  # the tenant's: prefixes are reused only within one salt

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
        self.settings = settings
        self._refresh = refresh
        self.answer = Answer(sampling, settings.sample_locally)
        self.history: list[int] = []  # tokens every stage holds (after a successful step)
        self.step_sizes: list[int] = []  # how the history was fed, step by step
        self.counts = StepCounts()
        self.lost_at: float | None = None  # when a recovery last moved it (monotonic)
        self.session_id = uuid.uuid4().hex
        self._on_snapshot(clients, route)
        self.result = Generation(session_id=self.session_id, prompt_tokens=list(prompt_ids))
        # speculation only within every stage's exact step (meshnet.route.exactness)
        plan = plan_speculation(settings.speculate, route)
        self.result.speculate = plan.drafts
        self.result.speculation_limit, self.result.speculation_reason = plan.limit, plan.reason
        self.result.load_dependent = route.load_dependent
        self.result.windows = pipelined_windows(settings.windows, self.result.speculate,
                                                route.discard_depth)

    def _on_snapshot(self, clients: Sequence[StageClient], route: RouteInfo) -> None:
        """Runs the session's steps on `clients`, `route` (its start, or a recovery)."""
        self.clients = tuple(clients)
        self.route = route
        self.walk: Walk = walk_for(route, self.settings.topology, loop=self.settings.loop)
        self.ctx = StepContext(self.clients, route, self.key(), self.answer,
                               Reuse(salt=self.settings.cache_salt),
                               self.settings.chunk_tokens, self.counts)

    # -- a generation -----------------------------------------------------------------

    def generate(self, max_tokens: int, stop_at_eos: bool,
                 on_token: Callable[[int], None] | None) -> Generation:
        """Prefills the prompt and decodes up to `max_tokens` (fewer at a stop id or the
        end of the context); the result has no text yet."""
        result, route = self.result, self.route
        prompt_ids = result.prompt_tokens
        result.topology = self.walk.topology
        result.decode_loop = self.walk.loops
        started = time.perf_counter()
        token = self.prefill(prompt_ids)
        result.prefill_seconds = time.perf_counter() - started
        decode_started = time.perf_counter()
        engine_before = self.counts.engine_seconds
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
            tokens = (self.verified(token, further, stop_ids,
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
        result.decode_engine_seconds = self.counts.engine_seconds - engine_before
        result.boundary_bytes = self.counts.boundary_bytes
        result.prefill_wavefront = self.counts.prefill_wavefront
        result.loop_depth = self.counts.loop_depth
        return result

    def decoded(self, token: int, count: int, stop_ids: set[int],
                drafts: int = 0) -> Iterator[int]:
        """Up to `count` tokens after `token` (stops after a stop id), recovering as the
        steps do; a walk that loops drafts up to `drafts` tokens per step. `token` is
        always the one the route was fed last and has not answered yet: what a recovery
        feeds again."""
        produced = 0
        while produced < count:
            steps = self.walk.decode(self.ctx, token, self.history, count - produced, stop_ids,
                                     drafts, self.result.windows)
            try:
                for step in steps:
                    self.remember([token, *step.sampled[:-1]])  # the fed token, drafts that held
                    token = step.sampled[-1]
                    self.count_drafts(step.drafted, len(step.sampled) - 1)
                    for sampled in step.sampled[:count - produced]:
                        produced += 1
                        yield sampled
                        if sampled in stop_ids:
                            return
                return
            except StageError as exc:
                self.recover(exc)
                token = self.steps_with_recovery([*self.forget_history(), [token]])
                produced += 1
                yield token
                if token in stop_ids:
                    return
            finally:
                steps.close()

    def verified(self, token: int, count: int, stop_ids: set[int], lookup: PromptLookup,
                 length: DraftLength) -> Iterator[int]:
        """Up to `count` tokens after `token` (stopping after a stop id) in verification
        steps driven from here, for a walk that does not loop (the hub): each carries
        [token, drafts from prompt lookup] through every stage and the last stage answers
        the drafts that held and one more (docs/architecture.md, "Speculative decoding").
        The stages then hold the rejected drafts' positions too; the next step drops them
        first. `lookup` holds the context (prompt and tokens so far, `token` included)."""
        produced = 0
        held, held_by = len(self.history), self.session_id  # positions the stages hold
        while produced < count:
            if self.session_id != held_by:  # recovered: a new session holds the history only
                held, held_by = len(self.history), self.session_id
            n_past = len(self.history)
            room = min(count - produced - 1, self.route.n_ctx - n_past - 1, length.wanted())
            draft = lookup.draft(room)
            step = [token, *draft]
            try:
                out = self.walk.verify(self.ctx, step, n_past, discard=held > n_past)
            except StageError as exc:
                self.recover(exc)
                out = [self.steps_with_recovery([*self.forget_history(), [token]])]
                draft = []
                held, held_by = len(self.history), self.session_id
            else:
                accepted = len(out) - 1
                self.remember(step[:accepted + 1])
                held = n_past + len(step)
                self.count_drafts(len(draft), accepted)
                length.verified(len(draft), accepted)
            if not draft:
                length.decoded_plainly(len(out))
            for sampled in out[:count - produced]:
                produced += 1
                lookup.extend([sampled])
                token = sampled
                yield sampled
                if sampled in stop_ids:
                    return

    # -- the history --------------------------------------------------------------------

    def key(self) -> pb.RouteKey:
        return pb.RouteKey(route_id=self.route.route_id, epoch=self.route.epoch,
                           session_id=self.session_id)

    def prefill(self, prompt_ids: list[int]) -> int:
        """Feeds the prompt to the new session, starting from the longest cached prefix
        every stage holds (prefix.py), else cold; returns the token sampled after it."""
        block = self.route.prefix_block
        # deepseek4's stages keep the prompt up to its last grid boundary as an entry,
        # reusable only whole: the step that starts there asks for it (prefix_snapshot).
        snapshot = first_try(len(prompt_ids), block)
        cached = snapshot if self.settings.reuse_prefix else 0
        while cached:
            prefix = prompt_ids[:cached]
            try:
                token = self.walk.feed(self.ctx, prompt_ids[cached:], cached,
                                       self.ctx.reuse.prefilling(prefix, snapshot))
            except StageError as exc:
                # Some stage lacks it (evicted, restarted) or failed: this session's
                # state is unknown, so it goes on under a new id from what is left.
                cached = next_try(exc, cached, block)
                self.release()
                self.session_id = uuid.uuid4().hex
                self.result.session_id = self.session_id
                self._on_snapshot(self.clients, self.route)
                continue
            self.remember(prefix)
            self.remember(prompt_ids[cached:])
            self.result.cached_tokens = cached
            return token
        return self.steps_with_recovery([prompt_ids], self.ctx.reuse.prefilling((), snapshot))

    def steps_with_recovery(self, steps: list[list[int]], reuse: Reuse | None = None) -> int:
        """Feeds `steps` in turn after the history; returns the token sampled after the
        last. A failure re-prefills the whole history under a new session first.
        `reuse`: what the steps ask of the prefix cache (None: the session's own,
        StepContext.reuse); once recovered, the session's own (so a cold prefill asks for
        its snapshot on its first try only)."""
        reuse = self.ctx.reuse if reuse is None else reuse
        token = -1
        while True:
            try:
                while steps:
                    token = self.walk.feed(self.ctx, steps[0], len(self.history), reuse)
                    self.remember(steps.pop(0))
                return token
            except StageError as exc:
                self.recover(exc)
                reuse = self.ctx.reuse
                steps = self.forget_history() + steps

    def remember(self, step: list[int]) -> None:
        self.history.extend(step)
        self.step_sizes.append(len(step))

    def forget_history(self) -> list[list[int]]:
        """The history as steps to feed a new session, so that the re-prefilled state is
        bit for bit the state the session had: the steps as they were fed, except that
        steps go together up to the width every stage measured to compute each row as alone
        (RouteInfo.exact_step_rows; one at a time where none did). One prefill of
        it all would compute the decoded tokens' KV in a wide step, which differs in the
        last bits and can flip a later greedy token. A model whose numerics depend on
        step boundaries (RouteInfo.step_sensitive) gets its steps exactly as fed."""
        history, sizes = self.history, self.step_sizes
        self.history, self.step_sizes = [], []
        joinable = 1 if self.route.step_sensitive else max(1, self.route.exact_step_rows)
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
        the fresh snapshot. A recovered session refused a slot (CAPACITY_EXHAUSTED) waits
        for one, counted as no further recovery, until `wait_seconds` after the loss.
        Raises `cause` when it is not recoverable, and RecoveryFailed past
        `max_recoveries` or when no slot came within the wait."""
        result = self.result
        refused = cause.reason == "CAPACITY_EXHAUSTED" and self.lost_at is not None
        if refused:
            assert self.lost_at is not None
            wait = self.lost_at + self.settings.wait_seconds - time.monotonic()
            if wait <= 0:
                raise RecoveryFailed(
                    f"no session slot came free within {self.settings.wait_seconds:g}s of "
                    f"the recovery ({'; '.join(result.recovery_reasons)}): {cause}") from cause
        elif not cause.recoverable:
            raise cause
        else:
            result.recoveries += 1
            result.recovery_reasons.append(f"{cause.endpoint}: {cause.reason or cause.code}")
            if result.recoveries > self.settings.max_recoveries:
                raise RecoveryFailed(
                    f"gave up after {self.settings.max_recoveries} recoveries: "
                    + "; ".join(result.recovery_reasons)
                ) from cause
            self.lost_at, wait = time.monotonic(), self.settings.wait_seconds
        self.release()
        clients, route = self._refresh(wait, refused)
        self.session_id = uuid.uuid4().hex
        result.session_id = self.session_id
        self._on_snapshot(clients, route)

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

    def count_drafts(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.result.draft_tokens += drafted
            self.result.accepted_draft_tokens += accepted
            self.result.speculative_steps += 1
            self.result.rejected_steps += int(accepted < drafted)


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
