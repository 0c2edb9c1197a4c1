"""What exactness measured per device costs on SmolLM2-135M Q4_1 (docs/architecture.md,
"Exactness on every lane"):

    .venv/bin/python bench/exactness_cost.py [--rounds 5] [--threads 1] [--json out.json]

- the start-up probe: what each worker took to measure its exact step and batching (GetInfo
  exactness_probe_ms), for the whole model and for the stages of a 2-stage split;
- stepping alone: 8 concurrent sessions on a 2-stage chain (0:18, 18:30) whose stages share
  exact steps (the default), whose sessions each step alone (--exact-batch-rows 1: what a
  stage gets whose probe found shared steps inexact), and that batch as upstream does
  (--batching throughput); interleaved rounds, each setup's aggregate decode tokens/s and
  the median over rounds of its ratio to the exact shared steps in the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from route_bench import concurrent_decode, prompt_ids

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    route_key_of,
    start_route,
    worker_binary,
)
from meshnet.route import RouteDriver, StageClient

SPLIT = 18
SESSIONS = 8
SETUPS = {"exact": (), "alone": ("--exact-batch-rows", "1"),
          "throughput": ("--batching", "throughput")}


def probe_ms(binary: Path, model: Path, threads: int, logs: Path) -> dict[str, int]:
    """Each stage's probe time, by its layers, for the whole model and a 2-stage split."""
    found: dict[str, int] = {}
    for ranges in ([(0, 30)], [(0, SPLIT), (SPLIT, 30)]):
        specs = [LaunchSpec(model=model, layers=LayerRange(b, e), route_id="bench/probe",
                            threads=threads, ctx=256, exit_with_parent=True) for b, e in ranges]
        workers = start_route(binary, specs, logs, chain=len(ranges) > 1)
        try:
            for worker, (begin, end) in zip(workers, ranges, strict=True):
                client = StageClient(worker.endpoint)
                try:
                    found[f"{begin}:{end}"] = client.info(timeout=10).exactness_probe_ms
                finally:
                    client.close()
        finally:
            for worker in workers:
                worker.stop()
    return found


def sharing(binary: Path, model: Path, threads: int, rounds: int, logs: Path
            ) -> dict[str, dict[str, float]]:
    """8 sessions' aggregate decode tokens/s per setup, interleaved over `rounds`."""
    workers: list[WorkerProcess] = []
    drivers: dict[str, RouteDriver] = {}
    try:
        for name, extra in SETUPS.items():
            specs = [LaunchSpec(model=model, layers=LayerRange(b, e), route_id=f"bench/{name}",
                                threads=threads, ctx=512, slots=SESSIONS, extra=extra,
                                exit_with_parent=True) for b, e in ((0, SPLIT), (SPLIT, 30))]
            started = start_route(binary, specs, logs, chain=True)
            workers += started
            drivers[name] = RouteDriver([w.endpoint for w in started], topology="chain",
                                        route_key=route_key_of(started))
            drivers[name].connect(wait=30)
        prompt = prompt_ids(drivers["exact"])
        for driver in drivers.values():
            concurrent_decode(driver, prompt, 2)  # warm up
        rates: dict[str, list[float]] = {name: [] for name in SETUPS}
        names = list(SETUPS)
        for turn in range(rounds):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                rates[name].append(concurrent_decode(drivers[name], prompt, SESSIONS)[0])
            print(f"round {turn + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items()),
                  file=sys.stderr, flush=True)
    finally:
        for driver in drivers.values():
            driver.close()
        for worker in workers:
            worker.stop()
    return {name: {"best": max(values), "median": statistics.median(values),
                   "paired_vs_exact": round(statistics.median(
                       v / e for v, e in zip(values, rates["exact"], strict=True) if e), 3)}
            for name, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    options = parser.parse_args()
    binary, model = worker_binary(), smollm2_gguf()
    logs = Path(tempfile.mkdtemp(prefix="meshnet-exactness-cost-"))
    figures = {"probe_ms": probe_ms(binary, model, options.threads, logs),
               "sessions_8": sharing(binary, model, options.threads, options.rounds, logs)}
    print("start-up probe: " + ", ".join(f"layers {layers} {ms} ms"
                                         for layers, ms in figures["probe_ms"].items()))
    for name, figure in figures["sessions_8"].items():
        print(f"{SESSIONS} sessions, {name} ({' '.join(SETUPS[name]) or 'default'}): best "
              f"{figure['best']:.1f} tok/s, median {figure['median']:.1f}, "
              f"x{figure['paired_vs_exact']:.3f} of exact shared steps (paired)")
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
