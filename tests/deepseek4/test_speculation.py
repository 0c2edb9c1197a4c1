"""Speculation on deepseek4 routes (tiny random-weight models, real workers on loopback):
with rollback snapshots (--discard-depth) every stage can drop rejected drafts exactly, so
serial and pipelined speculation give plain decoding's tokens, greedy and sampled, on the
small model and on V4's depth split inside the hash-routed layers, and on the small model
with every layer on the GPU lane's device."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, Sampling

from ..lanes import Lane, on_gpu

pytestmark = pytest.mark.slow

ROUTE_ID = "test/deepseek4-speculation"
# Random weights: what repeats is what the model was shown, so drafts come from the prompt.
PROMPT = "the map of the world and the story of the sea coast line chart. " * 4
DRAFTS, WINDOWS = 3, 3
# One rejection may drop every window in flight but the oldest one's first token.
DISCARD_DEPTH = WINDOWS * (DRAFTS + 1) - 1
TOKENS = 40


def ring(lane: Lane, model: Path, split: list[tuple[int, int]], logs: Path,
         ) -> list[WorkerProcess]:
    specs = [lane.spec(LaunchSpec(model=model, layers=LayerRange(*span), route_id=ROUTE_ID,
                                  threads=1, ctx=1024, discard_depth=DISCARD_DEPTH))
             for span in split]
    return start_route(lane.binary, specs, logs, chain=True, ring=True, timeout=600)


@pytest.fixture(scope="module")
def rings(lanes: Callable[[str], Lane], ds4_small: Path, ds4_v4: Path,
          tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[Callable[[str, str], list[WorkerProcess]]]:
    """(model, lane) -> its ring, started on first use. small: 0:2, 2:3, 3:8 (the middle
    stage owns a hash-routed layer); v4: 43 layers as 0:2, 2:22, 22:43 (a seam inside the
    hash-routed layers 0-2)."""
    splits = {"small": (ds4_small, [(0, 2), (2, 3), (3, 8)]),
              "v4": (ds4_v4, [(0, 2), (2, 22), (22, 43)])}
    started: dict[tuple[str, str], list[WorkerProcess]] = {}

    def get(model: str, lane: str) -> list[WorkerProcess]:
        if (model, lane) not in started:
            path, split = splits[model]
            started[model, lane] = ring(lanes(lane), path, split,
                                        tmp_path_factory.mktemp(f"ds4-spec-{model}-{lane}"))
        return started[model, lane]

    yield get
    for workers in started.values():
        for worker in workers:
            worker.stop()


# V4's depth only on the CPU lane: the GPU lane's software device in `make test` is slow.
@pytest.mark.parametrize(("model", "lane"), [("small", "cpu"), ("v4", "cpu"),
                                            on_gpu("small", "gpu")])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_serial_and_pipelined_speculation_give_the_plain_tokens(
    rings: Callable[[str, str], list[WorkerProcess]], model: str, lane: str,
    sampling: Sampling,
) -> None:
    workers = rings(model, lane)
    with RouteDriver([w.endpoint for w in workers],
                     route_key=route_key_of(workers), topology="ring") as driver:
        route = driver.connect(wait=30)
        assert route.can_discard and route.discard_depth == DISCARD_DEPTH
        plain = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False, sampling=sampling)
        serial = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False,
                                 sampling=sampling, speculate=DRAFTS)
        piped = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False,
                                sampling=sampling, speculate=DRAFTS, windows=WINDOWS)
    assert serial.tokens == plain.tokens
    assert piped.tokens == plain.tokens
    assert serial.recoveries == piped.recoveries == 0
    assert serial.draft_tokens > 0 and piped.draft_tokens > 0, serial.to_json()
    print(f"{model} {lane} {sampling}: acceptance serial {serial.acceptance_rate:.2f} "
          f"pipelined {piped.acceptance_rate:.2f}, depth {piped.loop_depth}")
