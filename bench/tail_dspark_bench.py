"""What a DSpark drafter costs the last stage of a 3-stage deepseek4 ring (tiny random-weight
models, real workers on loopback, one thread each): per verify window, the drafting pass
(the last stage's meshnet_shard_draft_seconds) against the engine's step time
(meshnet_shard_engine_busy_seconds_total, which includes the drafter's intake of the tapped
rows; test-deepseek4-dspark separates the two on the same windows); the drafts' bytes on
the wire per window (next_drafts on the ring, encoded as the worker sends them); and the
acceptance. The same generation without the drafter must give the same tokens.

    .venv/bin/python bench/tail_dspark_bench.py [--layers 8|43] [--tokens 64] [--drafts 4]

Random weights: the acceptance says that drafts flow and are verified exactly, not what a
trained drafter accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tempfile
import urllib.request
from pathlib import Path

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK, write_tiny_dspark
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    route_key_of,
    start_route,
    worker_binary,
)
from meshnet.route import RouteDriver
from meshnet.route.proto import pb

PROMPT_TOKENS = [1, *range(20, 60)]


def metric(worker: WorkerProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics",
                                timeout=10) as page:
        text = page.read().decode()
    found = re.search(rf"^{name} ([\d.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def draft_bytes(drafts: list[int]) -> int:
    """Bytes next_drafts adds to a RingResponse (the same field on ForwardResponse)."""
    return pb.RingResponse(next_drafts=drafts).ByteSize()


def run(target: Path, drafter: Path | None, split: list[tuple[int, int]], tokens: int,
        k: int, logs: Path) -> tuple[dict[str, float], object]:
    specs = [LaunchSpec(model=target, layers=LayerRange(*span), route_id="bench/dspark",
                        threads=1, ctx=1024, discard_depth=2 * k + 1,
                        drafter=DrafterKind.DSPARK if drafter and span == split[-1] else None,
                        drafter_k=k if drafter and span == split[-1] else None,
                        drafter_model=drafter if drafter and span == split[-1] else None)
             for span in split]
    logs.mkdir(parents=True, exist_ok=True)
    workers = start_route(worker_binary(), specs, logs, ring=True)
    try:
        last = workers[-1]
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology="ring") as driver:
            driver.connect(wait=30)
            before = {n: metric(last, n) for n in ("meshnet_shard_engine_busy_seconds_total",
                                                    "meshnet_shard_draft_seconds_sum",
                                                    "meshnet_shard_draft_seconds_count")}
            generation = driver.generate(PROMPT_TOKENS, max_tokens=tokens, stop_at_eos=False,
                                         speculate=k, windows=1)
            after = {n: metric(last, n) - before[n] for n in before}
        return after, generation
    finally:
        for worker in workers:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=SMALL.n_layer)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=DSPARK.block_size - 1)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="meshnet-dspark-bench-"))
    shape = dataclasses.replace(SMALL, n_layer=options.layers)
    target = write_tiny_deepseek4(work / "target.gguf", shape, seed=1)
    drafter = write_tiny_dspark(work / "dspark.gguf", shape, DSPARK, seed=4)
    n = options.layers
    split = [(0, 2), (2, n // 2), (n // 2, n)] if n > 8 else [(0, 2), (2, 3), (3, n)]
    on, with_drafter = run(target, drafter, split, options.tokens, options.drafts, work / "on")
    _, plain = run(target, None, split, options.tokens, options.drafts, work / "off")
    assert with_drafter.tokens == plain.tokens, "the drafter changed the tokens"
    windows = with_drafter.speculative_steps
    passes = on["meshnet_shard_draft_seconds_count"]
    draft_ms = 1e3 * on["meshnet_shard_draft_seconds_sum"] / max(passes, 1)
    step_on = 1e3 * on["meshnet_shard_engine_busy_seconds_total"] / max(windows, 1)
    # a window of k drafts of ids as large as the vocabulary's (the tiny one: under 256)
    wire = draft_bytes([174] * options.drafts), draft_bytes([129279] * options.drafts)
    print(f"{n}-layer tiny V4, last stage {split[-1][0]}:{split[-1][1]}, {options.tokens} tokens, "
          f"K={options.drafts}, {windows} windows")
    print(f"last stage per window of {options.drafts + 1} rows: engine step {step_on:.2f} ms "
          f"(the drafter's intake of the tapped rows included), drafting {draft_ms:.2f} ms "
          f"over {passes:.0f} passes: {100 * draft_ms / step_on:.0f}% of the step")
    print(f"drafts on the wire: {wire[0]} bytes per window of {options.drafts} (tiny vocabulary), "
          f"{wire[1]} for ids near V4's 129280; {with_drafter.draft_tokens} drafts, "
          f"{with_drafter.accepted_draft_tokens} accepted ({with_drafter.acceptance_rate:.3f})")


if __name__ == "__main__":
    main()
