"""The ForwardRequests a session sends, and how a feed is cut into steps: pure functions
of the handshake, the session's key, what it asks of the prefix cache and what the last
stage answers (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshnet.route.compression import leg_encoding, packed
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.sampling import Sampling

# The smallest prefill chunk that still runs at batch speed: smaller steps leave the
# engine's batched kernels idle for more of each step than pipelining wins back.
MIN_CHUNK_TOKENS = 64
# Chunks per stage a prefill is cut into when it can be pipelined: enough to keep every
# stage busy at once for most of the prefill.
CHUNKS_PER_STAGE = 4


@dataclass(frozen=True)
class Answer:
    """What the last stage answers for the row the driver needs: the token the stage
    samples with `sampling`, or with `sample_locally` (and sampling that is not greedy)
    the logits, sampled here."""

    sampling: Sampling
    sample_locally: bool = False

    @property
    def logits(self) -> bool:
        return self.sample_locally and not self.sampling.greedy


@dataclass(frozen=True)
class Reuse:
    """What a session's steps ask of the stages' prefix cache (docs/architecture.md,
    "Prefix cache"). Every request built here carries it, so that no walk can leave it
    out and go cold: the tenant's `salt` on every step (what the steps compute is kept,
    and reused, for it alone: ForwardRequest.cache_salt); on a new session's prefill, the
    cached `prefix` it starts from, named by its first step (the one at n_past ==
    len(prefix): ForwardRequest.prefix_tokens), and the prompt's last grid boundary
    `snapshot` (> 0), where the step that starts there asks the stages to keep the
    positions before it as an entry of their own (ForwardRequest.prefix_snapshot; a
    memory that copies whole sequences only)."""

    salt: bytes = b""
    prefix: tuple[int, ...] = ()
    snapshot: int = 0

    def prefilling(self, prefix: Sequence[int], snapshot: int) -> Reuse:
        """The same salt, for a new session's prefill from the cached `prefix` (empty:
        cold), asking for a snapshot at `snapshot` (0: none)."""
        return Reuse(self.salt, tuple(prefix), snapshot)


def chunks(route: RouteInfo, n_tokens: int, chunk_tokens: int | None = None,
           n_past: int = 0) -> list[tuple[int, int]]:
    """[start, end) of each step of a feed of `n_tokens` after `n_past`: `chunk_tokens` when
    given, else small enough that a prefill fills the pipeline (CHUNKS_PER_STAGE chunks per
    stage) and large enough that each step still runs at batch speed (MIN_CHUNK_TOKENS).
    Nothing to pipeline (one stage, or stages that take turns on the same CPUs), or a
    model whose numerics depend on its steps: the largest steps, as the unsplit model
    takes them. A route with a prefix cache: the cache's grid, whole blocks at multiples
    of the block from position 0, so that any session computes a block as any other does
    and its positions are reusable bit for bit (docs/architecture.md, "Prefix cache")."""
    if route.prefix_block and not chunk_tokens:
        return grid_chunks(route.prefix_block, n_tokens, n_past)
    n_stages = len(route.stages)
    size = chunk_tokens or max(MIN_CHUNK_TOKENS, -(-n_tokens // (CHUNKS_PER_STAGE * n_stages)))
    if (n_stages == 1 or route.stages_take_turns or route.step_sensitive) and not chunk_tokens:
        size = route.max_step_tokens
    size = max(1, min(size, route.max_step_tokens))
    return [(start, min(start + size, n_tokens)) for start in range(0, n_tokens, size)]


def grid_chunks(block: int, n_tokens: int, n_past: int) -> list[tuple[int, int]]:
    """[start, end) of the steps of a feed of `n_tokens` after `n_past`, cut at the
    multiples of `block` (absolute positions)."""
    steps, start = [], 0
    while start < n_tokens:
        end = min(n_tokens, start + block - (n_past + start) % block)
        steps.append((start, end))
        start = end
    return steps


def sampled_output(answer: Answer, n_tokens: int, wants_token: bool = True) -> pb.OutputRequest:
    """The answer to a step of `n_tokens` for its last row: what sampling needs, or
    without `wants_token` (a prefill chunk before the last) the cheapest, one sampled id."""
    output = pb.OutputRequest(rows=[n_tokens - 1])
    if not wants_token:
        output.kind = pb.OUTPUT_KIND_SAMPLED
    elif answer.logits:
        output.kind = pb.OUTPUT_KIND_LOGITS
    else:
        output.kind = pb.OUTPUT_KIND_SAMPLED
        _copy_sampling(output.sampling, answer.sampling)
    return output


def verified_output(answer: Answer, n_tokens: int) -> pb.OutputRequest:
    """The answer to a verification step of `n_tokens` (the last token and its drafts):
    the accepted drafts and one more (VERIFIED), or where the driver samples every row's
    logits (verified here, the same rule)."""
    if answer.logits:
        return pb.OutputRequest(kind=pb.OUTPUT_KIND_LOGITS, rows=range(n_tokens))
    output = pb.OutputRequest(kind=pb.OUTPUT_KIND_VERIFIED)
    _copy_sampling(output.sampling, answer.sampling)
    return output


def stage_request(
    route: RouteInfo, index: int, key: pb.RouteKey, tokens: Sequence[int], n_past: int,
    output: pb.OutputRequest, reuse: Reuse, previous: pb.ForwardResponse | None = None,
    discard: bool = False,
) -> pb.ForwardRequest:
    """One step for the stage at `index`: `tokens` at positions from `n_past`, the first
    stage's (and any stage needing the token sideband's) input ids, `reuse`, the boundary
    of `previous` (the previous stage's answer to this step), and on the last stage
    `output`, what the step answers. `discard`: the stage first drops what it holds past
    `n_past` (a previous step's rejected drafts)."""
    last = index == len(route.stages) - 1
    request = _request(route, index, key, tokens, n_past, output if last else None, reuse,
                       previous, discard)
    if not last:  # its answer's boundary comes to the driver over this leg
        request.answer_encoding = _leg_encoding(route, index)
    return request


def relay_request(route: RouteInfo, key: pb.RouteKey, tokens: Sequence[int], n_past: int,
                  output: pb.OutputRequest, reuse: Reuse,
                  discard: bool = False) -> pb.ForwardRequest:
    """One step through the chain, sent to the first stage, which relays it on (with
    `reuse`); the last stage's `output` comes back along the chain."""
    request = _request(route, 0, key, tokens, n_past, output, reuse, None, discard)
    request.relay = True
    return request


def loop_request(
    route: RouteInfo, key: pb.RouteKey, token: int, n_past: int, count: int,
    stop_ids: Iterable[int], answer: Answer, reuse: Reuse, drafts: int = 0,
    draft_context: Sequence[int] = (), windows: int = 1,
) -> pb.ForwardRequest:
    """The first stage decodes `count` tokens after `token` by itself (ForwardStream
    continue_tokens), relaying each step on when there are more stages, and stops after
    a stop id. `drafts`: it speculates, drafting up to that many tokens per step from
    `draft_context` (the history) and what it decodes (ForwardRequest.loop_drafts), with
    up to `windows` verify windows in flight (ForwardRequest.loop_windows)."""
    request = _request(route, 0, key, [token], n_past, sampled_output(answer, 1), reuse, None,
                       False)
    request.relay = len(route.stages) > 1
    request.continue_tokens = count - 1
    request.stop_token_ids.extend(sorted(stop_ids))
    if drafts:
        request.loop_drafts = drafts
        request.draft_context.extend(draft_context)
        if windows > 1:
            request.loop_windows = windows
    return request


def _request(route: RouteInfo, index: int, key: pb.RouteKey, tokens: Sequence[int],
             n_past: int, output: pb.OutputRequest | None, reuse: Reuse,
             previous: pb.ForwardResponse | None, discard: bool) -> pb.ForwardRequest:
    stage = route.stages[index]
    request = pb.ForwardRequest(
        key=key,
        n_past=n_past,
        positions=range(n_past, n_past + len(tokens)),
        expected_range=pb.LayerRange(begin=stage.begin, end=stage.end),
    )
    verifies = output is not None and output.kind == pb.OUTPUT_KIND_VERIFIED
    # A verifier checks the drafts; with a prefix cache every stage records what it holds.
    if index == 0 or stage.needs_token_sideband or verifies or route.prefix_block:
        request.tokens.extend(tokens)
    if previous is not None:  # as the leg to this stage carries it
        request.boundary.CopyFrom(packed(previous.boundary, _leg_encoding(route, index)))
    if output is not None:
        request.output.CopyFrom(output)
    if discard:
        request.discard_from = n_past
    _ask_cache(request, reuse, previous)
    return request


def _leg_encoding(route: RouteInfo, index: int) -> pb.BoundaryEncoding:
    stage = route.stages[index]
    return leg_encoding(route.boundary_compression, stage.endpoint, stage.boundary_encodings)


def _ask_cache(request: pb.ForwardRequest, reuse: Reuse,
               previous: pb.ForwardResponse | None) -> None:
    """`request` salted, naming the cached prefix when it is the prefill's first step
    and asking for a snapshot when it starts at the prompt's last grid boundary (Reuse)."""
    request.cache_salt = reuse.salt
    if reuse.prefix and request.n_past == len(reuse.prefix):
        request.prefix_tokens.extend(reuse.prefix)
        if previous is not None:
            # a stage after the first matches the prefix only with the digest chain of
            # the boundary that stage computed it from (a chain relays it by itself)
            request.prefix_chain.extend(previous.prefix_chain)
    if reuse.snapshot and request.n_past == reuse.snapshot:
        request.prefix_snapshot = True


def _copy_sampling(target: pb.SamplingParams, sampling: Sampling) -> None:
    target.temperature = sampling.temperature
    target.top_k = sampling.top_k
    target.top_p = sampling.top_p
    target.seed = sampling.seed
