"""The route driver: walks a pipeline of shard workers for one generation at a time
per call (calls may run concurrently from several threads, one session each).

Topology (docs/architecture.md). Chain, preferred whenever the workers were started with
--next-stage: the driver sends each decode step to the first stage only, every stage
relays its boundary to the next, and the last stage's sampled token comes back along
the chain - the driver-to-stage legs drop from 2S to 2 and boundaries never pass through
the driver. Hub, the fallback: the driver calls every stage in turn. A prefill of several
chunks is pipelined through the stages as a wavefront, unless the stages take turns on
one host's CPUs (RouteInfo.stages_take_turns): then it goes chunk after chunk, through
the chain when there is one.

On CACHE_MISS, EPOCH_MISMATCH, ENGINE_FAILURE, a restarted chain stage or a worker that
went away, it waits for the route, checks it again and re-prefills the whole history
under a new session id; positional seeding keeps the output identical.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from meshnet.route.drafts import MAX_DRAFT, DraftLength, PromptLookup
from meshnet.route.errors import (
    PromptTooLong,
    RecoveryFailed,
    RouteError,
    RouteRefused,
    StageError,
)
from meshnet.route.handshake import RouteInfo, check_route
from meshnet.route.proto import pb
from meshnet.route.requests import Answer, chunks, loop_request, relay_request, stage_request
from meshnet.route.sampling import Sampling, sample
from meshnet.route.speculation import speculated
from meshnet.route.stage import StageClient, TlsFiles
from meshnet.route.topology import Topology, decodes_in_loop, pick_topology

RELEASE_TIMEOUT_SECONDS = 5.0
# The widest step whose rows compute exactly as one-token steps (a verification step of
# MAX_DRAFT drafts; the CPU lane's batch-invariant kernels).
EXACT_ROWS = MAX_DRAFT + 1


@dataclass
class Generation:
    """What one `generate` call produced, with its timings."""

    session_id: str
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "max_tokens"  # max_tokens | eos | context
    topology: str = "hub"  # hub | chain | ring
    decode_loop: bool = False  # the first stage drove the decode (ForwardStream)
    prefill_wavefront: bool = False  # a prefill's chunks were pipelined through the stages
    recoveries: int = 0
    recovery_reasons: list[str] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Engine time of the decode steps, summed over the stages (the stages' own account,
    # from each answer's chain trace): the rest of decode_seconds went to the network,
    # the hand-offs between threads and the driver.
    decode_engine_seconds: float = 0.0
    boundary_bytes: int = 0
    # Speculative decoding (meshnet.route.speculation): the longest draft (0: off), the
    # draft tokens verified, those accepted, and the steps that carried a draft.
    speculate: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    speculative_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_tokens) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first token comes out of the prefill; each later one costs one decode step.
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["prefill_tokens_per_second"] = round(self.prefill_tokens_per_second, 2)
        data["decode_tokens_per_second"] = round(self.decode_tokens_per_second, 2)
        data["acceptance_rate"] = round(self.acceptance_rate, 4)
        return data


class RouteDriver:
    """Drives generations over the stages at `endpoints`, in pipeline order."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        max_recoveries: int = 4,
        wait_seconds: float = 60.0,
        chunk_tokens: int | None = None,
        sample_locally: bool = False,
        topology: str = Topology.AUTO,
        decode_loop: bool = True,
        speculate: int = 0,
    ) -> None:
        if topology not in tuple(Topology):
            raise RouteError(f"topology must be one of {', '.join(Topology)}, not {topology!r}")
        if not endpoints:
            raise RouteError("a route needs at least one --stage")
        self.clients = [StageClient(endpoint, tls) for endpoint in endpoints]
        self.max_recoveries = max_recoveries
        self.wait_seconds = wait_seconds
        self.chunk_tokens = chunk_tokens
        self.sample_locally = sample_locally
        self.topology = Topology(topology)
        self.decode_loop = decode_loop
        self.speculate = _draft_cap(speculate)
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
                answers = [(c.endpoint, c.info(timeout=5.0)) for c in self.clients]
                route = check_route(answers)
                if self.topology in (Topology.CHAIN, Topology.RING) and not route.chained:
                    raise RouteRefused([f"topology {self.topology} needs every stage but the "
                                        "last started with --next-stage"])
                if self.topology is Topology.RING and not route.ringed:
                    raise RouteRefused(["topology ring needs the first stage subscribed at the "
                                        "route's last stage (--ring-last)"])
                return route
            except (StageError, RouteError):
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def topology_of(self, route: RouteInfo) -> Topology:
        """How a generation goes through `route`: ring, chain or hub (pick_topology)."""
        return pick_topology(route, self.topology, loop=self._loop)

    def uses_chain(self, route: RouteInfo) -> bool:
        return self.topology_of(route) is not Topology.HUB

    def uses_loop(self, route: RouteInfo) -> bool:
        """The first stage decodes by itself (ForwardStream continue_tokens)."""
        return decodes_in_loop(route, self.topology_of(route), loop=self._loop)

    @property
    def _loop(self) -> bool:
        """The first stage may decode by itself: the decode loop is on and the last stage
        samples."""
        return self.decode_loop and not self.sample_locally

    def _vocab_client(self) -> StageClient:
        route = self.route
        for client, stage in zip(self.clients, route.stages, strict=True):
            if stage.has_vocab:
                return client
        raise RouteError("no stage can tokenize")

    def tokenize(self, text: str) -> list[int]:
        return self._vocab_client().tokenize(text, add_special=True)

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
    ) -> Generation:
        """Prefills `prompt` (text or token ids) and decodes up to `max_tokens`.
        `speculate`: draft up to that many tokens per step (prompt lookup, verified
        exactly; None: the driver's default, 0: off); only where every stage can discard."""
        sampling = sampling or Sampling()
        route = self.route
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise RouteError("the prompt is empty")
        if len(prompt_ids) > route.n_ctx:
            raise PromptTooLong(
                f"the prompt has {len(prompt_ids)} tokens, the route's context holds {route.n_ctx}"
            )
        run = _Run(self, prompt_ids, sampling)
        cap = self.speculate if speculate is None else _draft_cap(speculate)
        run.result.speculate = cap if route.can_discard else 0
        try:
            return self._generate(run, route, max_tokens, stop_at_eos, on_token)
        finally:
            # every ending frees the session on every stage: done, failed, or stopped by
            # an exception from on_token (a client that went away)
            run.release()

    def _generate(self, run: _Run, route: RouteInfo, max_tokens: int, stop_at_eos: bool,
                  on_token: Callable[[int], None] | None) -> Generation:
        prompt_ids = run.result.prompt_tokens
        run.result.topology = self.topology_of(route).value
        run.result.decode_loop = self.uses_loop(route)
        started = time.perf_counter()
        token = run.step_with_recovery(prompt_ids)
        run.result.prefill_seconds = time.perf_counter() - started
        decode_started = time.perf_counter()
        engine_before = run.engine_seconds
        stop_ids = set(route.eos_token_ids) if stop_at_eos else set()
        further = min(max_tokens - 1, route.n_ctx - len(run.history))
        run.result.tokens.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids:
            run.result.stop_reason = "eos"
        elif further > 0:
            # A route whose first stage loops speculates inside the loop (no driver
            # round trip per step); else the driver verifies the drafts itself.
            tokens = (speculated(run, token, further, stop_ids, *drafter(
                          [*prompt_ids, token], run.result.speculate))
                      if run.result.speculate and not self.uses_loop(route) else
                      run.decoded(token, further, stop_ids, drafts=run.result.speculate))
            for next_token in tokens:
                run.result.tokens.append(next_token)
                if on_token is not None:
                    on_token(next_token)
                if next_token in stop_ids:
                    run.result.stop_reason = "eos"
                    break
        if run.result.stop_reason != "eos" and len(run.result.tokens) < max_tokens:
            run.result.stop_reason = "context"
        run.result.decode_seconds = time.perf_counter() - decode_started
        run.result.decode_engine_seconds = run.engine_seconds - engine_before
        run.result.text = self.detokenize(run.result.tokens)
        return run.result


def _draft_cap(speculate: int) -> int:
    if not 0 <= speculate <= MAX_DRAFT:
        raise RouteError(f"speculate drafts 0..{MAX_DRAFT} tokens per step, not {speculate}")
    return speculate


def drafter(context: list[int], cap: int) -> tuple[PromptLookup, DraftLength]:
    """Prompt lookup over `context` and a draft length that starts at `cap` and adapts."""
    lookup = PromptLookup()
    lookup.extend(context)
    return lookup, DraftLength(start=cap, most=cap)


class _Run:
    """One generation's session: the history fed so far and the step logic."""

    def __init__(self, driver: RouteDriver, prompt_ids: list[int], sampling: Sampling) -> None:
        self.driver = driver
        self.sampling = sampling
        self.answer = Answer(sampling, driver.sample_locally)
        self.history: list[int] = []  # tokens every stage holds (after a successful step)
        self.step_sizes: list[int] = []  # how the history was fed, step by step
        self.session_id = uuid.uuid4().hex
        self.result = Generation(session_id=self.session_id, prompt_tokens=list(prompt_ids))
        self.engine_seconds = 0.0  # every answered step's engine time, over its stages

    def answered(self, response: pb.ForwardResponse) -> pb.ForwardResponse:
        self.engine_seconds += sum(hop.engine_micros for hop in response.chain) * 1e-6
        return response

    def key(self, route: RouteInfo) -> pb.RouteKey:
        return pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=self.session_id)

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
                    token = self.feed(steps[0], n_past=len(self.history))
                    self.remember(steps.pop(0))
                return token
            except StageError as exc:
                if not exc.recoverable:
                    raise
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
        last bits and can flip a later greedy token (SmolLM2, 3 stages: the 48th token
        after a restart at the 47th, tests/route/test_route_recovery.py). A model whose
        numerics depend on step boundaries (RouteInfo.step_sensitive) gets its steps
        exactly as fed."""
        history, sizes = self.history, self.step_sizes
        self.history, self.step_sizes = [], []
        joinable = 1 if self.driver.route.step_sensitive else EXACT_ROWS
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

    def decoded(self, token: int, count: int, stop_ids: set[int],
                drafts: int = 0) -> Iterator[int]:
        """Up to `count` tokens after `token` (stops after a stop id), recovering as
        the steps do; a decode loop drafts up to `drafts` tokens per step."""
        produced = 0
        while produced < count:
            if not self.driver.uses_loop(self.driver.route):
                token = self.step_with_recovery([token])
                produced += 1
                yield token
                if token in stop_ids:
                    return
                continue
            pending = [token]  # fed to the route, not yet acknowledged
            try:
                for sampled in self.loop(token, count - produced, stop_ids, pending,
                                         drafts=drafts):
                    produced += 1
                    token = sampled
                    yield sampled
                return
            except StageError as exc:
                if not exc.recoverable:
                    raise
                self.recover(exc)
                token = self.steps_with_recovery([*self.forget_history(), pending])
                produced += 1
                yield token
                if token in stop_ids:
                    return

    def loop(self, token: int, count: int, stop_ids: set[int], pending: list[int],
             drafts: int = 0) -> Iterator[int]:
        """The first stage decodes `count` tokens by itself; `pending` holds the token
        the route was last fed and has not answered yet. `drafts`:
        the loop speculates, drafting up to that many tokens per step from the history
        (ForwardRequest.loop_drafts); a step then answers the drafts that held and one
        more token."""
        route = self.driver.route
        request = loop_request(route, self.key(route), token, len(self.history), count,
                               stop_ids, self.answer, drafts, self.history)
        stream = self.driver.clients[0].forward_stream(request)
        produced = 0
        try:
            for response in stream:
                self.answered(response)
                self.check_chain(route, response)
                sampled = ([int(t) for t in response.sampled_tokens]
                           or [self.take_output(response, response.n_past - 1)])
                self.remember([pending[0], *sampled[:-1]])  # the fed token, the drafts that held
                pending[0] = sampled[-1]
                self.count_drafts(response.drafted_tokens, len(sampled) - 1)
                self.result.boundary_bytes += route.seam_bytes_per_token * (
                    len(route.stages) - 1) * (1 + response.drafted_tokens)
                for token_out in sampled:
                    produced += 1
                    yield token_out
                    if token_out in stop_ids or produced == count:
                        return
        finally:
            stream.cancel()

    def count_drafts(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.result.draft_tokens += drafted
            self.result.accepted_draft_tokens += accepted
            self.result.speculative_steps += 1

    def check_chain(self, route: RouteInfo, response: pb.ForwardResponse) -> None:
        hops = [(h.layers.begin, h.layers.end, h.incarnation) for h in response.chain]
        expected = [(s.begin, s.end, s.incarnation) for s in route.stages]
        if hops != expected:
            raise StageError(
                route.stages[0].endpoint, "FAILED_PRECONDITION", "CHAIN_MISMATCH",
                f"the --next-stage chain ran {hops}, the route is {expected}",
            )

    def recover(self, cause: StageError) -> None:
        result = self.result
        result.recoveries += 1
        result.recovery_reasons.append(f"{cause.endpoint}: {cause.reason or cause.code}")
        if result.recoveries > self.driver.max_recoveries:
            raise RecoveryFailed(
                f"gave up after {self.driver.max_recoveries} recoveries: "
                + "; ".join(result.recovery_reasons)
            ) from cause
        self.release()
        self.driver.connect(wait=self.driver.wait_seconds)
        self.session_id = uuid.uuid4().hex
        result.session_id = self.session_id

    def release(self) -> None:
        """Frees the session on every stage (best effort: a gone stage holds nothing, and
        a frozen one gets RELEASE_TIMEOUT_SECONDS, then evicts the idle session itself)."""
        route = self.driver.route
        for client in self.driver.clients:
            with contextlib.suppress(StageError):
                client.release(self.key(route), timeout=RELEASE_TIMEOUT_SECONDS)

    def feed(self, tokens: list[int], n_past: int) -> int:
        """Runs `tokens` through every stage; returns the token sampled after the last.

        Several chunks are pipelined as a wavefront, so a prefill keeps every stage busy
        at once; stages that take turns on one host's CPUs get one chunk after another
        instead (on a 2-core VM, SmolLM2 2+2 threads, 128 tokens: 96.4% of the
        unsplit model's prefill as one step through the chain, 83.6% as two 64-token
        chunks of a wavefront, paired medians of 9 rounds)."""
        route = self.driver.route
        steps = chunks(route, len(tokens), self.driver.chunk_tokens)
        if len(steps) == 1 or route.stages_take_turns:  # one stage computes at a time
            token = -1
            for start, end in steps:
                token = (self.feed_chain(route, tokens[start:end], n_past + start,
                                         wants_token=end == len(tokens))
                         if self.driver.uses_chain(route)
                         else self.wavefront(route, tokens[start:end], n_past + start))
            return token
        self.result.prefill_wavefront = True
        return self.wavefront(route, tokens, n_past, steps)

    def wavefront(self, route: RouteInfo, tokens: list[int], n_past: int,
                  chunks: list[tuple[int, int]] | None = None) -> int:
        """`chunks` of `tokens` (all of them in one by default) through every stage,
        chunk k at stage s while chunk k-1 is at stage s+1; the token sampled last."""
        chunks = chunks or [(0, len(tokens))]
        n_stages = len(self.driver.clients)
        outputs: dict[tuple[int, int], pb.Boundary] = {}
        token = -1
        for wave in range(len(chunks) + n_stages - 1):
            calls = []
            for stage_index in range(n_stages):
                chunk_index = wave - stage_index
                if not 0 <= chunk_index < len(chunks):
                    continue
                start, end = chunks[chunk_index]
                boundary = outputs.pop((stage_index - 1, chunk_index), None)
                if boundary is not None:
                    self.result.boundary_bytes += len(boundary.data)
                request = stage_request(route, stage_index, self.key(route), tokens[start:end],
                                        n_past + start, boundary, self.answer,
                                        wants_token=chunk_index == len(chunks) - 1)
                call = self.driver.clients[stage_index].forward_async(request)
                calls.append((stage_index, chunk_index, request, call))
            for stage_index, chunk_index, request, call in calls:
                response = self.answered(call.result())
                if stage_index < n_stages - 1:
                    outputs[(stage_index, chunk_index)] = response.boundary
                elif chunk_index == len(chunks) - 1:
                    token = self.take_output(response, request.positions[-1])
        return token

    def feed_chain(self, route: RouteInfo, tokens: list[int], n_past: int,
                   wants_token: bool = True) -> int:
        """One step through the chain: only the first stage is called. Without
        `wants_token` (a prefill chunk before the last) it asks for the cheapest answer."""
        request = relay_request(route, self.key(route), tokens, n_past, self.answer, wants_token)
        response = self.answered(self.driver.clients[0].forward(request))
        self.result.boundary_bytes += route.seam_bytes_per_token * len(tokens) * (
            len(route.stages) - 1)
        self.check_chain(route, response)
        return self.take_output(response, request.positions[-1])

    def take_output(self, response: pb.ForwardResponse, position: int) -> int:
        if response.sampled_tokens:
            return int(response.sampled_tokens[0])
        logits = np.asarray(response.rows[0].logits, dtype=np.float32)
        return sample(logits, self.sampling, position)

