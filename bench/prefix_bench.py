"""What the prefix cache buys on a 3-stage SmolLM2 route (1 thread per stage): the time to
first token of a 1,500-token shared system prompt plus a 50-token question, cold and on a
hit, and the throughput of an agent-like trace of 16 sessions (one shared scaffold,
different questions) with the cache on and off.

    .venv/bin/python bench/prefix_bench.py [--rounds 3] [--sessions 16] [--concurrency 4]

Two routes run side by side: one with the cache off (the workers' defaults) and one with
it on (--prefix-cache-entries 4 --prefix-block 64). Rounds interleave cold, cold-on-grid
and hit requests, each with a question of its own; the table prints min / median / max.

    .venv/bin/python bench/prefix_bench.py --grid [--rounds 5] [--prompt 1000]

What the grid costs a cold prefill (the figure behind the recipe's default block): SmolLM2
(3 stages x 1 thread) and the small tiny deepseek4 (3 stages x 1 thread), each with the
cache off and on with blocks of 64 to 512 tokens, side by side; each round sends every
route the same fresh prompt (no hit: the cost of cutting prefills on the grid and of
keeping entries), interleaved; it prints prefill tokens/s (min / median / max) and whether
the route answered the cache-off route's tokens.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    route_key_of,
    start_route,
    worker_binary,
)
from meshnet.route import RouteDriver

SPLIT = [(0, 10), (10, 20), (20, 30)]
SYSTEM_TOKENS, QUESTION_TOKENS = 1500, 50
PARAGRAPH = ("You are the support agent of a freight company. Answer politely, cite the "
             "tariff table when prices come up, never promise delivery dates, and escalate "
             "damaged goods to a human. Tools: track(parcel_id), quote(weight, zone), "
             "reroute(parcel_id, address). ")


def start(binary: Path, model: Path, log_dir: Path, cached: bool) -> list[WorkerProcess]:
    extra = {"prefix_cache_entries": 4, "prefix_block": 64} if cached else {}
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), threads=1,
                        route_id="bench/prefix-" + ("on" if cached else "off"), **extra)
             for span in SPLIT]
    log_dir.mkdir(parents=True, exist_ok=True)
    return start_route(binary, specs, log_dir)


GRID_BLOCKS = (64, 128, 256, 512)
GRID_MODELS = {  # name -> (its split, its ids to draw prompts from)
    "smollm2": ([(0, 10), (10, 20), (20, 30)], (200, 40000)),
    "deepseek4": ([(0, 2), (2, 3), (3, 8)], (3, 170)),  # the small tiny model
}


def grid(binary: Path, work: Path, rounds: int, prompt_tokens: int) -> None:
    """Cold prefill throughput on the grid of each block against the cache off."""
    models = {"smollm2": smollm2_gguf(),
              "deepseek4": write_tiny_deepseek4(work / "ds4-small.gguf", SMALL, seed=1)}
    routes: dict[tuple[str, int], list[WorkerProcess]] = {}
    drivers: dict[tuple[str, int], RouteDriver] = {}
    try:
        for name, (split, _) in GRID_MODELS.items():
            for block in (0, *GRID_BLOCKS):  # 0: the cache off
                cache = {"prefix_cache_entries": 4, "prefix_block": block} if block else {}
                specs = [LaunchSpec(model=models[name], layers=LayerRange(*span), threads=1,
                                    ctx=prompt_tokens + 64, route_id=f"bench/grid-{block}",
                                    **cache) for span in split]
                (work / f"{name}-{block}").mkdir(parents=True)
                routes[name, block] = start_route(binary, specs, work / f"{name}-{block}")
                drivers[name, block] = RouteDriver([w.endpoint for w in routes[name, block]],
                                                   route_key=route_key_of(routes[name, block]),
                                                   reuse_prefix=False)
                drivers[name, block].connect(wait=60)
        rates: dict[tuple[str, int], list[float]] = {key: [] for key in routes}
        same: dict[tuple[str, int], bool] = dict.fromkeys(routes, True)
        rng = random.Random(11)
        for _ in range(rounds):
            for name, (_, (low, high)) in GRID_MODELS.items():
                prompt = [rng.randrange(low, high) for _ in range(prompt_tokens)]
                blocks = [0, *GRID_BLOCKS]
                rng.shuffle(blocks)  # no route always runs first (or right after another)
                answers = {}
                for block in blocks:
                    run = drivers[name, block].generate(prompt, max_tokens=4, stop_at_eos=False)
                    rates[name, block].append(prompt_tokens / run.prefill_seconds)
                    answers[block] = run.tokens
                for block in GRID_BLOCKS:
                    same[name, block] &= answers[block] == answers[0]
        print(f"Cold prefill of {prompt_tokens} tokens, 3 stages x 1 thread, {rounds}"
              " interleaved rounds (prompt tok/s, min / median / max)")
        for name in GRID_MODELS:
            off = statistics.median(rates[name, 0])
            for block in (0, *GRID_BLOCKS):
                label = f"block {block}" if block else "cache off"
                median = statistics.median(rates[name, block])
                tokens = "" if not block else \
                    ("  same tokens as off" if same[name, block] else "  OTHER tokens than off")
                print(f"  {name:9s} {label:10s} {spread(rates[name, block])}"
                      f"  {median / off - 1:+6.1%}{tokens}")
    finally:
        for driver in drivers.values():
            driver.close()
        for workers in routes.values():
            for worker in workers:
                worker.stop()


def spread(values: list[float]) -> str:
    return (f"{min(values):7.3f} / {statistics.median(values):7.3f} / {max(values):7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--completion", type=int, default=32, help="tokens per trace answer")
    parser.add_argument("--grid", action="store_true",
                        help="measure what the grid costs a cold prefill, per block and model")
    parser.add_argument("--prompt", type=int, default=1000, help="--grid: prompt tokens")
    options = parser.parse_args()
    binary, model = worker_binary(), smollm2_gguf()
    work = Path(tempfile.mkdtemp(prefix="meshnet-prefix-bench-"))
    if options.grid:
        grid(binary, work, options.rounds, options.prompt)
        return
    off_route = start(binary, model, work / "off", cached=False)
    on_route = start(binary, model, work / "on", cached=True)
    try:
        off = RouteDriver([w.endpoint for w in off_route], route_key=route_key_of(off_route))
        on = RouteDriver([w.endpoint for w in on_route], route_key=route_key_of(on_route))
        on_cold = RouteDriver([w.endpoint for w in on_route],
                              route_key=route_key_of(on_route), reuse_prefix=False)
        for driver in (off, on, on_cold):
            driver.connect(wait=60)
        system = off.tokenize(PARAGRAPH * 40)[:SYSTEM_TOKENS]
        words = off.tokenize(" ".join(f"question {i} about parcel {i * 7919 % 10007}"
                                      for i in range(300)))

        def question(i: int) -> list[int]:
            start_at = (i * QUESTION_TOKENS) % (len(words) - QUESTION_TOKENS)
            return words[start_at:start_at + QUESTION_TOKENS]

        assert len(system) == SYSTEM_TOKENS
        on.generate(system + question(9999), max_tokens=1)  # the scaffold is cached once
        ttft: dict[str, list[float]] = {"cold, cache off": [], "cold, cache on (grid)": [],
                                        "hit": []}
        cached: list[int] = []
        drivers: dict[str, RouteDriver] = {"cold, cache off": off,
                                           "cold, cache on (grid)": on_cold, "hit": on}
        n = 0
        for _ in range(options.rounds):
            for name, driver in drivers.items():
                n += 1
                run = driver.generate(system + question(n), max_tokens=1)
                ttft[name].append(run.prefill_seconds)
                if name == "hit":
                    cached.append(run.cached_tokens)
        print(f"TTFT, {SYSTEM_TOKENS}-token system prompt + {QUESTION_TOKENS}-token question, "
              f"3 stages x 1 thread, {options.rounds} interleaved rounds (s, min / median / max)")
        for name, values in ttft.items():
            print(f"  {name:24s} {spread(values)}")
        print(f"  cached tokens on a hit: {sorted(set(cached))}")
        print(f"  speedup (median cold, cache off / median hit): "
              f"{statistics.median(ttft['cold, cache off']) / statistics.median(ttft['hit']):.1f}x")

        def trace(driver: RouteDriver, first: int) -> tuple[float, int, int]:
            prompts = [system + question(first + i) for i in range(options.sessions)]

            def one(prompt: list[int]) -> tuple[int, int]:
                run = driver.generate(prompt, max_tokens=options.completion, stop_at_eos=False)
                return len(run.tokens), run.cached_tokens

            started = time.perf_counter()
            with ThreadPoolExecutor(options.concurrency) as pool:
                results = list(pool.map(one, prompts))
            seconds = time.perf_counter() - started
            return seconds, sum(r[0] for r in results), sum(r[1] > 0 for r in results)

        print(f"\nTrace: {options.sessions} sessions (scaffold + own question, "
              f"{options.completion} tokens each), {options.concurrency} at a time")
        for round_ in range(options.rounds):
            for name, driver in (("cache off", off), ("cache on", on)):
                seconds, tokens, hits = trace(driver, 1000 * (round_ + 1))
                print(f"  round {round_}  {name:9s} {seconds:7.2f} s  "
                      f"{options.sessions / seconds:5.2f} sessions/s  "
                      f"{tokens / seconds:6.1f} completion tok/s  hits {hits}/{options.sessions}")
        for driver in (off, on, on_cold):
            driver.close()
    finally:
        for worker in off_route + on_route:
            worker.stop()


if __name__ == "__main__":
    main()
