"""Drives a route (or the unsplit reference) for certification: logits teacher-forced on
the reference's greedy tokens, one stage call after another with the whole prompt in one
step (the same computation on both sides), and single-session greedy decode speed through
the route driver, the reference's and the route's measured in turn."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    if len(prompt) > min(route.max_step_tokens, route.n_ctx - steps - 1):
        raise RouteError(f"a certification prompt of {len(prompt)} tokens does not fit the"
                         f" route (step limit {route.max_step_tokens}, context {route.n_ctx})")
    key = pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=uuid.uuid4().hex)
    rows: list[np.ndarray] = []
    chosen: list[int] = []
    feed, n_past = list(prompt), 0
    try:
        for step in range(steps + 1):
            row = _step(clients, route, key, feed, n_past)
            rows.append(row)
            n_past += len(feed)
            token = int(np.argmax(row)) if forced is None else int(forced[step])
            chosen.append(token)
            feed = [token]
    finally:
        for client in clients:
            with contextlib.suppress(StageError):
                client.release(key)
    return rows, chosen


def _step(clients: Sequence[StageClient], route: RouteInfo, key: pb.RouteKey,
          tokens: list[int], n_past: int) -> np.ndarray:
    boundary: pb.Boundary | None = None
    response = None
    for index, (client, stage) in enumerate(zip(clients, route.stages, strict=True)):
        request = pb.ForwardRequest(
            key=key, n_past=n_past, positions=range(n_past, n_past + len(tokens)),
            expected_range=pb.LayerRange(begin=stage.begin, end=stage.end))
        if index == 0 or stage.needs_token_sideband:
            request.tokens.extend(tokens)
        if boundary is not None:
            request.boundary.CopyFrom(boundary)
        if index == len(clients) - 1:
            request.output.kind = pb.OUTPUT_KIND_LOGITS
            request.output.rows.append(len(tokens) - 1)
        response = client.forward(request)
        boundary = response.boundary
    assert response is not None
    return np.asarray(response.rows[0].logits, dtype=np.float32)


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
