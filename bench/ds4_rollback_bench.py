"""What deepseek4's rollback snapshots cost a decode step: engine ms per token of a tiny
random-weight V4 (43 layers) decoded unsplit and as a 3-stage ring, at several
--discard-depth values (0: no speculation possible), 1 thread per worker.

    .venv/bin/python bench/ds4_rollback_bench.py [--depths 0,7,27] [--tokens 32] [--rounds 3]

Each (depth, layout) runs --rounds times in interleaved order; the table prints min-max.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from meshnet.api.shardroute import LayerRange
from meshnet.devtools.tiny_deepseek4 import V4_DEPTH, write_tiny_deepseek4
from meshnet.local.process import LaunchSpec, route_key_of, start_route, worker_binary
from meshnet.route import RouteDriver

PROMPT = "the map of the world and the story of the sea coast line chart. " * 4
LAYOUTS = {"unsplit": [(0, 43)], "3-stage ring": [(0, 15), (15, 29), (29, 43)]}


def engine_ms(binary: Path, model: Path, split: list[tuple[int, int]], depth: int,
              tokens: int, log_dir: Path) -> float:
    """Engine ms per decoded token, summed over the stages."""
    log_dir.mkdir(parents=True, exist_ok=True)
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), route_id="bench/ds4-rollback",
                        threads=1, ctx=1024, discard_depth=depth or None, local_relay=False)
             for span in split]
    ring = len(split) > 1
    workers = start_route(binary, specs, log_dir, chain=ring, ring=ring)
    try:
        with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers)) as driver:
            driver.connect(wait=30)
            generation = driver.generate(PROMPT, max_tokens=tokens, stop_at_eos=False)
        return 1000.0 * generation.decode_engine_seconds / max(len(generation.tokens) - 1, 1)
    finally:
        for worker in workers:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="0,7,27", help="--discard-depth values.")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bin-dir", type=Path, default=None)
    options = parser.parse_args()
    binary = options.bin_dir / "meshnet-shard-worker" if options.bin_dir else worker_binary()
    work = Path(tempfile.mkdtemp(prefix="meshnet-ds4-rollback-"))
    model = write_tiny_deepseek4(work / "tiny-v4.gguf", V4_DEPTH, seed=3)
    depths = [int(d) for d in options.depths.split(",")]
    runs: dict[tuple[int, str], list[float]] = {}
    for round_ in range(options.rounds):
        for depth in depths:
            for name, split in LAYOUTS.items():
                ms = engine_ms(binary, model, split, depth, options.tokens,
                               work / f"r{round_}-d{depth}-{len(split)}")
                runs.setdefault((depth, name), []).append(ms)
                print(f"  depth {depth:>3} {name:<13} {ms:6.1f} ms/token", flush=True)
    print(f"\ntiny V4 (43 layers), {options.tokens} tokens, engine ms per token "
          f"(min-max of {options.rounds}):")
    print(f"{'discard depth':>13} " + " ".join(f"{name:>15}" for name in LAYOUTS))
    for depth in depths:
        cells = [runs[(depth, name)] for name in LAYOUTS]
        print(f"{depth:>13} " + " ".join(f"{min(c):6.1f}-{max(c):<8.1f}" for c in cells))


if __name__ == "__main__":
    main()
