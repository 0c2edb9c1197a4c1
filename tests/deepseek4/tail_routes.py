"""What the tail-drafter suites share (test_tail_drafter.py for MTP, test_tail_dspark.py for a
DSpark GGUF): 3-stage routes of a tiny V4 model whose last stage hosts a drafter or not,
the drafter's pass count, and the runs every such route must pass."""

from __future__ import annotations

import re
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import Generation, RouteDriver, Sampling

from ..lanes import Lane

# the small model as 0:2, 2:3, 3:8; V4's 43 layers with a seam inside the hash-routed ones
SPLITS = {"small": [(0, 2), (2, 3), (3, 8)], "v4": [(0, 2), (2, 22), (22, 43)]}
TOKENS = 32
# ids of distinct byte and piece tokens: nothing repeats, so prompt lookup has little to say
PROMPT_TOKENS = [1, *range(20, 60)]


def drafting_passes(worker: WorkerProcess) -> int:
    """How many times the stage's drafter drafted (its /metrics histogram's count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics",
                                timeout=10) as page:
        text = page.read().decode()
    found = re.search(r"^meshnet_shard_draft_seconds_count (\d+)$", text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


@dataclass(frozen=True)
class Drafting:
    """The drafter a suite's last stages host: `kind`, `drafts` per window,
    `windows` in flight at most."""

    kind: DrafterKind
    drafts: int
    windows: int

    @property
    def discard_depth(self) -> int:
        return self.windows * (self.drafts + 1) - 1


class TailRoutes:
    """Routes of a suite's models, started on first use and stopped with the module:
    (model, kind) -> workers, kind "on" | "off" | "chain" (on, without the ring) |
    "restart" (on, its loop's answers sent as they come, so that the driver sees a token
    before the loop has run far ahead of it). `models`: each model's GGUF and the drafter
    GGUF its last stage loads (None: the model's own MTP block); `lane`: where they run."""

    def __init__(self, lane: Lane, route_id: str, drafting: Drafting,
                 models: dict[str, tuple[Path, Path | None]], logs: pytest.TempPathFactory):
        self.lane, self.route_id, self.drafting = lane, route_id, drafting
        self.models, self.logs = models, logs
        self.started: dict[tuple[str, str], list[WorkerProcess]] = {}

    def __call__(self, model: str, kind: str) -> list[WorkerProcess]:
        if (model, kind) not in self.started:
            split, (path, drafter_file) = SPLITS[model], self.models[model]
            hosts = kind != "off"
            flush = ("--stream-flush-ms", "0") if kind == "restart" else ()
            specs = [self.lane.spec(LaunchSpec(
                         model=path, layers=LayerRange(*span), route_id=self.route_id,
                         threads=1, ctx=512, discard_depth=self.drafting.discard_depth,
                         drafter=self.drafting.kind if hosts and span == split[-1] else None,
                         drafter_k=self.drafting.drafts if hosts and span == split[-1] else None,
                         drafter_model=drafter_file if hosts and span == split[-1] else None,
                         extra=flush if span == split[0] else ()))
                     for span in split]
            self.started[model, kind] = start_route(
                self.lane.binary, specs,
                self.logs.mktemp(f"ds4-{self.drafting.kind.value}-{model}-{kind}-{self.lane.name}"),
                chain=True, ring=kind != "chain", timeout=600)
        return self.started[model, kind]

    def stop(self) -> None:
        for workers in self.started.values():
            for worker in workers:
                worker.stop()


def runs_on_and_off(routes: TailRoutes, model: str, kinds: list[str],
                    sampling: Sampling) -> dict[tuple[str, str], Generation]:
    """Plain, serial and pipelined speculation on each route of `kinds` (kind, how) ->
    generation; plain decoding asks for no drafts, so the drafter runs no pass for it."""
    drafting, runs = routes.drafting, {}
    for kind in kinds:
        workers = routes(model, kind)
        topology = "chain" if kind == "chain" else "ring"
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology=topology) as driver:
            driver.connect(wait=30)
            passes = drafting_passes(workers[-1]) if kind != "off" else 0
            runs[kind, "plain"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling)
            if kind != "off":
                assert drafting_passes(workers[-1]) == passes
            runs[kind, "serial"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                   stop_at_eos=False, sampling=sampling,
                                                   speculate=drafting.drafts, windows=1)
            runs[kind, "piped"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling,
                                                  speculate=drafting.drafts,
                                                  windows=drafting.windows)
    plain = runs["off", "plain"].tokens
    assert all(run.tokens == plain for run in runs.values())
    assert all(run.recoveries == 0 for run in runs.values())
    # every window after the first carries the drafter's drafts (lookup had few to offer),
    # by the ring or, without one, in the chain's answer
    for kind in kinds:
        if kind != "off":
            serial = runs[kind, "serial"]
            assert serial.draft_tokens >= drafting.drafts * (TOKENS // (drafting.drafts + 1)), (
                serial.to_json())
            assert serial.draft_tokens > runs["off", "serial"].draft_tokens
    for key, run in runs.items():
        print(f"{drafting.kind.value} {model} {sampling} {key}: drafts {run.draft_tokens},"
              f" accepted {run.accepted_draft_tokens} ({run.acceptance_rate:.3f}),"
              f" depth {run.loop_depth}")
    return runs


def kill_costs_one_recovery(routes: TailRoutes, tokens: int) -> None:
    """The small model's last stage killed at the second token and restarted 0.5 s later:
    one recovery, the tokens of the run without it, and the restarted stage drafting again
    (it rebuilds the drafter's state as the driver re-prefills)."""
    workers = routes("small", "restart")
    last, seen = workers[-1], [0]

    def kill_then_restart_later(_: int) -> None:
        seen[0] += 1
        if seen[0] == 2:
            last.kill()
            threading.Timer(0.5, last.start).start()

    drafts = routes.drafting.drafts
    with RouteDriver([w.endpoint for w in workers],
                     route_key=route_key_of(workers), topology="ring") as driver:
        driver.connect(wait=30)
        expected = driver.generate(PROMPT_TOKENS, max_tokens=tokens, stop_at_eos=False,
                                   speculate=drafts, windows=1)
        generation = driver.generate(PROMPT_TOKENS, max_tokens=tokens, stop_at_eos=False,
                                     speculate=drafts, windows=1, on_token=kill_then_restart_later)
    assert generation.tokens == expected.tokens
    assert generation.recoveries == 1
    assert drafting_passes(last) > 0  # counted since the restart
