"""Hub: the driver calls every stage in turn and carries each boundary on. A prefill of
several chunks goes through as a wavefront, chunk k at stage s while chunk k-1 is at stage
s+1, so that every stage computes at once; stages that take turns on one host's CPUs get
one chunk after another instead."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

from meshnet.api.common import Topology
from meshnet.route.compression import raw_size
from meshnet.route.proto import pb
from meshnet.route.requests import Reuse, chunks, sampled_output, stage_request, verified_output
from meshnet.route.step_context import DecodedStep, StepContext

Feed = Callable[[StepContext, list[int], int, Reuse], int]
# One chunk of a feed: its tokens, their first position, whether it is the last.
OneStep = Callable[[list[int], int, bool], int]


class HubWalk:
    topology: Topology = "hub"
    loops = False

    def feed(self, ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse) -> int:
        return in_chunks(ctx, tokens, n_past, reuse,
                         lambda part, at, _last: wavefront(ctx, part, at, reuse))

    def verify(self, ctx: StepContext, tokens: list[int], n_past: int,
               discard: bool) -> list[int]:
        output = verified_output(ctx.answer, len(tokens))
        previous: pb.ForwardResponse | None = None
        response = pb.ForwardResponse()
        for index, client in enumerate(ctx.clients):
            if previous is not None:
                ctx.counts.boundary_bytes += raw_size(previous.boundary)
            request = stage_request(ctx.route, index, ctx.key, tokens, n_past, output,
                                    ctx.reuse, previous, discard)
            response = ctx.answered(client.forward(request))
            previous = response
        return ctx.accepted(response, tokens, n_past)

    def decode(self, ctx: StepContext, token: int, history: Sequence[int], count: int,
               stop_ids: set[int], drafts: int, windows: int) -> Generator[DecodedStep]:
        return step_by_step(self.feed, ctx, token, len(history), count, stop_ids)


def in_chunks(ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse,
              one_step: OneStep) -> int:
    """A feed cut into chunks (requests.chunks): as a wavefront when there is more than
    one and the stages do not take turns on the same CPUs, else chunk after chunk through
    `one_step`. The token sampled after the last."""
    route = ctx.route
    steps = chunks(route, len(tokens), ctx.chunk_tokens, n_past)
    if len(steps) > 1 and not route.stages_take_turns:
        return wavefront(ctx, tokens, n_past, reuse, steps)
    token = -1
    for start, end in steps:
        token = one_step(tokens[start:end], n_past + start, end == len(tokens))
    return token


def wavefront(ctx: StepContext, tokens: list[int], n_past: int, reuse: Reuse,
              steps: list[tuple[int, int]] | None = None) -> int:
    """`steps` of `tokens` (all of them in one by default) through every stage, step k at
    stage s while step k-1 is at stage s+1, asking the prefix cache for `reuse`; the token
    sampled last."""
    steps = steps or [(0, len(tokens))]
    if len(steps) > 1:
        ctx.counts.prefill_wavefront = True
    n_stages = len(ctx.clients)
    outputs: dict[tuple[int, int], pb.ForwardResponse] = {}  # a stage's answer to a step
    token = -1
    for wave in range(len(steps) + n_stages - 1):
        calls = []
        for stage_index in range(n_stages):
            step_index = wave - stage_index
            if not 0 <= step_index < len(steps):
                continue
            start, end = steps[step_index]
            previous = outputs.pop((stage_index - 1, step_index), None)
            if previous is not None:
                ctx.counts.boundary_bytes += raw_size(previous.boundary)
            output = sampled_output(ctx.answer, end - start,
                                    wants_token=step_index == len(steps) - 1)
            request = stage_request(ctx.route, stage_index, ctx.key, tokens[start:end],
                                    n_past + start, output, reuse, previous)
            call = ctx.clients[stage_index].forward_async(request)
            calls.append((stage_index, step_index, request, call))
        for stage_index, step_index, request, call in calls:
            response = ctx.answered(call.result())
            if stage_index < n_stages - 1:
                outputs[(stage_index, step_index)] = response
            elif step_index == len(steps) - 1:
                token = ctx.token_of(response, request.positions[-1])
    return token


def step_by_step(feed: Feed, ctx: StepContext, token: int, n_past: int, count: int,
                 stop_ids: set[int]) -> Generator[DecodedStep]:
    """Decoding by the driver: each token fed back as the next step, one round trip each."""
    for _ in range(count):
        token = feed(ctx, [token], n_past, ctx.reuse)
        n_past += 1
        yield DecodedStep([token])
        if token in stop_ids:
            return
