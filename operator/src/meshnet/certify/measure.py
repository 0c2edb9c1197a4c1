"""Drives a route (or the unsplit reference) for certification: logits teacher-forced on
the reference's greedy tokens, one stage call after another with the whole prompt in one
step (the same computation on both sides); verify windows and the one-row steps at their
positions; sessions stepping at once; and single-session greedy decode speed through the
route driver, the reference's and the route's measured in turn."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from meshnet.certify.verdict import Row
from meshnet.route.driver import RouteDriver
from meshnet.route.errors import RouteError, StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.route_key import RouteSecret
from meshnet.route.stage import StageClient, TlsFiles


def forced_logits(clients: Sequence[StageClient], route: RouteInfo, prompt: Sequence[int],
                  steps: int, forced: Sequence[int] | None = None
                  ) -> tuple[list[np.ndarray], list[int]]:
    """Logits after the prompt and after each of `steps` next tokens, and the tokens fed:
    `forced` when given (the route under test), else each row's argmax (the reference)."""
    _check_fits(route, len(prompt), steps + 1)
    rows: list[np.ndarray] = []
    chosen: list[int] = []
    feed, n_past = list(prompt), 0
    with _session(clients, route) as key:
        for step in range(steps + 1):
            [row] = _step(clients, route, key, feed, n_past, [len(feed) - 1])
            rows.append(row.logits)
            n_past += len(feed)
            token = int(np.argmax(row.logits)) if forced is None else int(forced[step])
            chosen.append(token)
            feed = [token]
    return rows, chosen


def window_rows(clients: Sequence[StageClient], route: RouteInfo, prompt: Sequence[int],
                window: Sequence[int], *, one_row: bool) -> list[Row]:
    """Every row of `window` after the prompt, with its boundary at each seam: in one step
    of len(window) rows (a verify window), or `one_row`, one step per token."""
    _check_fits(route, len(prompt), len(window))
    with _session(clients, route) as key:
        _step(clients, route, key, list(prompt), 0, [len(prompt) - 1])
        if not one_row:
            return _step(clients, route, key, list(window), len(prompt),
                         list(range(len(window))))
        return [row for at, token in enumerate(window)
                for row in _step(clients, route, key, [token], len(prompt) + at, [0])]


def forced_together(clients: Sequence[StageClient], route: RouteInfo,
                    prompts: Sequence[Sequence[int]], forced: Sequence[Sequence[int]],
                    steps: int) -> list[list[np.ndarray]]:
    """forced_logits of every prompt at once, one session each on its own thread, so that
    the stages may step them together as they would concurrent users."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        runs = [pool.submit(forced_logits, clients, route, prompt, steps, tokens)
                for prompt, tokens in zip(prompts, forced, strict=True)]
        return [run.result()[0] for run in runs]


def _check_fits(route: RouteInfo, prompt: int, after: int) -> None:
    if prompt > min(route.max_step_tokens, route.n_ctx - after):
        raise RouteError(f"a certification prompt of {prompt} tokens does not fit the"
                         f" route (step limit {route.max_step_tokens}, context {route.n_ctx})")


@contextlib.contextmanager
def _session(clients: Sequence[StageClient], route: RouteInfo) -> Iterator[pb.RouteKey]:
    """A new session's key; the session is released on every stage afterwards."""
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=uuid.uuid4().hex)
    try:
        yield key
    finally:
        for client in clients:
            with contextlib.suppress(StageError):
                client.release(key)


def _step(clients: Sequence[StageClient], route: RouteInfo, key: pb.RouteKey,
          tokens: list[int], n_past: int, rows: list[int]) -> list[Row]:
    """One step of `tokens` through every stage in turn; the logits of `rows` and, for
    each, its boundary row at every seam."""
    boundary: pb.Boundary | None = None
    response = None
    seams: list[list[bytes]] = [[] for _ in rows]
    for index, (client, stage) in enumerate(zip(clients, route.stages, strict=True)):
        request = pb.ForwardRequest(
            key=key, n_past=n_past, positions=range(n_past, n_past + len(tokens)),
            expected_range=pb.LayerRange(begin=stage.begin, end=stage.end))
        if index == 0 or stage.needs_token_sideband:
            request.tokens.extend(tokens)
        if boundary is not None:
            request.boundary.CopyFrom(boundary)
        last = index == len(clients) - 1
        if last and rows:
            request.output.kind = pb.OUTPUT_KIND_LOGITS
            request.output.rows.extend(rows)
        response = client.forward(request)
        boundary = response.boundary
        if not last:
            width = len(boundary.data) // len(tokens)
            for out, row in zip(seams, rows, strict=True):
                out.append(boundary.data[row * width:(row + 1) * width])
    assert response is not None
    return [Row(np.asarray(found.logits, dtype=np.float32), tuple(seam))
            for found, seam in zip(response.rows, seams, strict=True)]


@dataclass(frozen=True)
class DecodeSpeeds:
    reference: float  # best greedy decode tokens/s of the unsplit reference
    route: float  # and of the route
    topology: str  # how the route was driven


def decode_speeds(reference: str, endpoints: Sequence[str], prompt: Sequence[int], tokens: int,
                  repeats: int, tls: TlsFiles | None = None,
                  route_key: RouteSecret | None = None) -> DecodeSpeeds:
    """Best greedy decode tokens/s of the reference and of the route over `repeats`
    rounds; each round measures one then the other, so that a change in the machine's
    load between rounds reaches both sides alike."""
    best_reference, best_route, topology = 0.0, 0.0, "hub"
    with RouteDriver([reference]) as unsplit, \
            RouteDriver(list(endpoints), tls=tls, route_key=route_key) as route:
        unsplit.connect(wait=30.0)
        route.connect(wait=30.0)
        for _ in range(repeats):
            alone = unsplit.generate(list(prompt), max_tokens=tokens, stop_at_eos=False)
            split = route.generate(list(prompt), max_tokens=tokens, stop_at_eos=False)
            best_reference = max(best_reference, alone.decode_tokens_per_second)
            best_route = max(best_route, split.decode_tokens_per_second)
            topology = split.topology
    return DecodeSpeeds(best_reference, best_route, topology)
