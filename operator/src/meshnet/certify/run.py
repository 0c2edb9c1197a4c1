"""One certification run: the route's stages against the unsplit reference started on
this machine, on the fixed prompt set, judged by the parity and useful-speed gates, and
the route against itself for what its lane promises: verify windows that compute as
one-row steps (when it speculates), sessions at once that compute as alone (when it
batches)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshnet.api.certification import (
    BatchInvarianceResult,
    Certificate,
    CertifiedLane,
    ParityResult,
    StepInvarianceResult,
)
from meshnet.certify import verdict
from meshnet.certify.gates import Gates
from meshnet.certify.measure import decode_speeds, forced_logits, forced_together, window_rows
from meshnet.certify.prompts import PROMPTS
from meshnet.certify.reference import reference_worker
from meshnet.route.driver import RouteDriver
from meshnet.route.route_key import RouteSecret
from meshnet.route.stage import StageClient, TlsFiles
from meshnet.timestamps import now_rfc3339

Say = Callable[[str], None]


@dataclass(frozen=True)
class Reference:
    """How to run the unsplit reference here."""

    binary: Path
    model: Path
    threads: int = 0
    log: Path | None = None


def certify(endpoints: Sequence[str], lane: CertifiedLane, reference: Reference,
            gates: Gates | None = None, *, tls: TlsFiles | None = None,
            route_key: RouteSecret | None = None, route_digest: str | None = None,
            epoch: int | None = None, request: str | None = None,
            say: Say = lambda _: None) -> Certificate:
    gates = gates or Gates()
    with RouteDriver(list(endpoints), tls=tls, route_key=route_key) as driver:
        route = driver.connect(wait=30.0)
        prompts = [driver.tokenize(text) for text in PROMPTS]
    ctx = max(len(p) for p in prompts) + max(gates.parity_steps, gates.speed_tokens) + 8
    say(f"unsplit reference: {reference.model.name} on this machine")
    with reference_worker(reference.binary, reference.model, layers=route.n_layer,
                          ctx=max(ctx, 256), threads=reference.threads, backend=lane.backend,
                          log=reference.log) as ref_endpoint:
        compared = _parity(list(endpoints), ref_endpoint, prompts, gates, tls, route_key)
        say(f"parity: {compared.parity_summary()}")
        steps = _step_invariance(list(endpoints), prompts, compared.tokens, lane.verify_rows,
                                 tls, route_key) if lane.verify_rows > 1 else None
        if steps is not None:
            say(f"step invariance: {_summary(steps)} of {steps.windows} windows of"
                f" {steps.window_rows} rows")
        batches = lane.sessions > 1 and not lane.load_dependent  # Throughput promises nothing
        batch = _batch_invariance(list(endpoints), prompts, compared, lane.sessions, gates,
                                  tls, route_key) if batches else None
        if batch is not None:
            say(f"batch invariance: {_summary(batch)} of {batch.sessions} sessions at once")
        speeds = decode_speeds(ref_endpoint, endpoints, prompts[0], gates.speed_tokens,
                               gates.repeats, tls, route_key)
    pace = verdict.speed(speeds.route, speeds.reference, gates.speed_fraction, speeds.topology)
    say(f"speed: route {speeds.route:.1f} tok/s ({speeds.topology}),"
        f" unsplit {speeds.reference:.1f} tok/s")
    now = now_rfc3339()
    return verdict.certificate(lane, compared.result, pace, stages=len(route.stages), now=now,
                               steps=steps, batch=batch,
                               route_digest=route_digest or route.route_digest or None,
                               epoch=epoch if epoch is not None else route.epoch,
                               request=request)


@dataclass(frozen=True)
class _Compared:
    result: ParityResult
    tokens: list[list[int]]  # per prompt: the reference's greedy tokens
    route_rows: list[list[np.ndarray]]  # per prompt: the route's rows, one session alone

    def parity_summary(self) -> str:
        worst = self.result.max_abs_delta_logit
        return (f"max |delta logit| {'non-finite' if worst is None else f'{worst:.3g}'},"
                f" {self.result.rows_differing} of {self.result.rows_compared} rows differ,"
                f" greedy {'identical' if self.result.greedy_match else 'DIFFERS'}"
                f" over {self.result.prompts} prompts x {self.result.decode_steps + 1} rows")


def _summary(result: StepInvarianceResult | BatchInvarianceResult) -> str:
    worst = result.max_abs_delta_logit
    return (f"max |delta logit| {'non-finite' if worst is None else f'{worst:.3g}'},"
            f" {result.rows_differing} of {result.rows_compared} rows differ")


def _parity(endpoints: list[str], ref_endpoint: str, prompts: list[list[int]], gates: Gates,
            tls: TlsFiles | None, route_key: RouteSecret | None) -> _Compared:
    compared, chosen, routed = [], [], []
    with RouteDriver([ref_endpoint]) as ref_driver, \
            RouteDriver(endpoints, tls=tls, route_key=route_key) as driver:
        ref_route, route = ref_driver.connect(wait=30.0), driver.connect(wait=30.0)
        ref_clients: list[StageClient] = ref_driver.clients
        for prompt in prompts:
            ref_rows, tokens = forced_logits(ref_clients, ref_route, prompt, gates.parity_steps)
            rows, _ = forced_logits(driver.clients, route, prompt, gates.parity_steps, tokens)
            compared.append(verdict.PromptLogits(ref_rows, rows, tokens))
            chosen.append(tokens)
            routed.append(rows)
    return _Compared(verdict.parity(compared, gates.tolerance), chosen, routed)


def _step_invariance(endpoints: list[str], prompts: list[list[int]], tokens: list[list[int]],
                     rows: int, tls: TlsFiles | None,
                     route_key: RouteSecret | None) -> StepInvarianceResult:
    """After each prompt a window of `rows` tokens, as a verify window would carry them
    (the reference's next tokens, then the prompt's own as a lookup draft would propose
    them), in one step and in one-row steps: every row's logits and boundaries compared."""
    windows = []
    with RouteDriver(endpoints, tls=tls, route_key=route_key) as driver:
        route = driver.connect(wait=30.0)
        for prompt, chosen in zip(prompts, tokens, strict=True):
            window = (list(chosen) + list(prompt) * rows)[:rows]
            wide = window_rows(driver.clients, route, prompt, window, one_row=False)
            alone = window_rows(driver.clients, route, prompt, window, one_row=True)
            windows.append(verdict.WindowRows(wide, alone))
    return verdict.step_invariance(windows, rows)


def _batch_invariance(endpoints: list[str], prompts: list[list[int]], compared: _Compared,
                      sessions: int, gates: Gates, tls: TlsFiles | None,
                      route_key: RouteSecret | None) -> BatchInvarianceResult:
    """`sessions` sessions at once, session i on prompt i (cycling through the set), fed
    the reference's tokens as parity fed them alone: every row compared with the route's
    row alone."""
    which = [i % len(prompts) for i in range(sessions)]
    with RouteDriver(endpoints, tls=tls, route_key=route_key) as driver:
        route = driver.connect(wait=30.0)
        together = forced_together(driver.clients, route, [prompts[i] for i in which],
                                   [compared.tokens[i] for i in which], gates.parity_steps)
    return verdict.batch_invariance(
        [verdict.SessionRows(i, rows, compared.route_rows[i])
         for i, rows in zip(which, together, strict=True)], sessions)
