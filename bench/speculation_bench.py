"""Speculative decoding over a WAN-like route: decode tokens/s of a 3-stage SmolLM2 route
(1 thread per stage) with a user-space delay proxy adding --delay-ms one way on every leg
(driver to each stage, stage to stage), with and without speculation, on a repetitive
workload (code that is edited line by line) and on free text.

    .venv/bin/python bench/speculation_bench.py [--bin-dir DIR] [--delay-ms 10]
        [--tokens 64] [--speculate 7] [--repeats 3]

Rows: the chain with the first stage's decode loop (the fastest path without
speculation: 2(S-1) legs per token plus the driver's 2 per generation), speculation in
that loop (the first stage drafts, the last verifies: 2(S-1) legs per verification step),
and the hub (2S legs per step) without and with speculation, the hub's verified by the
driver. Each
row's tokens are checked against plain greedy decoding of the same route (the loop row)
and the bench fails if any differs. The ring limit is the best a ring without
speculation can do: the stages' engine time per token (measured on the loop row) plus S
legs. Rounds are interleaved; the table gives medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.devtools.link_model import Link
from meshnet.devtools.link_proxy import LinkProxy
from meshnet.local.process import LaunchSpec, free_port, start_route, worker_binary
from meshnet.route import Generation, RouteDriver

SPLIT = [(0, 10), (10, 20), (20, 30)]
WORKLOADS = {
    "repetitive (code edit)": (
        "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
        "        total = total + value\n    return total\n\ndef mean(values):\n"
        "    total = sum_list(values)\n    return total / len(values)\n\n"
        "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
    ),
    "free text": "Once upon a time, in a small village by the sea,",
}


@contextmanager
def delayed_chain(binary: Path, model: Path, delay: float) -> Iterator[list[str]]:
    """The stages of SPLIT behind proxies, each relaying to the next through a proxy too;
    yields the driver's endpoints (the proxies)."""
    ports = [free_port() for _ in SPLIT]
    front = [LinkProxy(port, Link(delay)) for port in ports]
    links = [LinkProxy(port, Link(delay)) for port in ports[1:]]
    # local_relay off: the stages relay over gRPC, through the proxies (the local relay
    # would connect around them)
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), threads=1,
                        listen=f"127.0.0.1:{ports[i]}",
                        local_relay=False,
                        next_stage=f"127.0.0.1:{links[i].port}" if i < len(links) else "")
             for i, span in enumerate(SPLIT)]
    workers = start_route(binary, specs, Path(tempfile.mkdtemp(prefix="meshnet-spec-")))
    try:
        yield [f"127.0.0.1:{proxy.port}" for proxy in front]
    finally:
        for worker in workers:
            worker.stop()
        for proxy in [*front, *links]:
            proxy.stop()


def run(endpoints: list[str], prompt: str, tokens: int, topology: str,
        speculate: int) -> Generation:
    with RouteDriver(endpoints, topology=topology) as driver:
        driver.connect(wait=30)
        driver.generate([1, 2, 3], max_tokens=2, stop_at_eos=False)  # warm the channels
        return driver.generate(prompt, max_tokens=tokens, stop_at_eos=False,
                               speculate=speculate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=None)
    parser.add_argument("--delay-ms", type=float, default=10.0, help="One way, per leg.")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--speculate", type=int, default=7, help="Longest draft.")
    parser.add_argument("--repeats", type=int, default=3, help="Interleaved rounds.")
    options = parser.parse_args()
    binary = options.bin_dir / "meshnet-shard-worker" if options.bin_dir else worker_binary()
    delay = options.delay_ms / 1000.0
    setups = [("chain + decode loop, no speculation", "chain", 0),
              (f"chain loop, speculate {options.speculate}", "chain", options.speculate),
              ("hub, no speculation", "hub", 0),
              (f"hub, speculate {options.speculate}", "hub", options.speculate)]
    results: dict[tuple[str, str], list[Generation]] = {}
    with delayed_chain(binary, smollm2_gguf(), delay) as endpoints:
        for round_ in range(options.repeats):
            for workload, prompt in WORKLOADS.items():
                turned = setups[round_ % len(setups):] + setups[:round_ % len(setups)]
                for label, topology, speculate in turned:
                    generation = run(endpoints, prompt, options.tokens, topology, speculate)
                    results.setdefault((workload, label), []).append(generation)
    failed = False
    print(f"SmolLM2-135M Q4_1, {len(SPLIT)} stages x 1 thread, {options.delay_ms:g} ms one way "
          f"per leg, {options.tokens} tokens, medians of {options.repeats}, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'workload':<24}{'setup':<38}{'tok/s':>7}{'x loop':>8}{'x ring':>8}"
          f"{'accepted':>11}{'steps':>7}  tokens")
    for workload in WORKLOADS:
        plain = results[(workload, setups[0][0])]
        engine_per_token = statistics.median(
            g.decode_engine_seconds / max(len(g.tokens) - 1, 1) for g in plain)
        ring = 1.0 / (engine_per_token + len(SPLIT) * delay)
        base = statistics.median(g.decode_tokens_per_second for g in plain)
        for label, _, speculate in setups:
            runs = results[(workload, label)]
            rate = statistics.median(g.decode_tokens_per_second for g in runs)
            same = all(g.tokens == plain[0].tokens for g in runs)
            failed |= not same
            drafted = sum(g.draft_tokens for g in runs)
            accepted = sum(g.accepted_draft_tokens for g in runs)
            steps = statistics.median(g.speculative_steps for g in runs)
            share = f"{accepted / drafted:.0%}" if drafted else "-"
            print(f"{workload:<24}{label:<38}{rate:>7.1f}{rate / base:>8.2f}{rate / ring:>8.2f}"
                  f"{share:>11}{steps if speculate else '-':>7}  "
                  f"{'identical' if same else 'DIFFER'}")
        print(f"{workload:<24}{'ring limit (engine + 3 legs)':<38}{ring:>7.1f}")
    if failed:
        sys.exit("speculation changed the tokens")


if __name__ == "__main__":
    main()
