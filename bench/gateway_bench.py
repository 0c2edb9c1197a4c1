"""Gateway overhead: the same greedy request through `meshnet serve` (streaming, as an
OpenAI client sends it), through the route driver in-process as `meshnet generate` streams
it (each token turned into text as it comes), and through the bare driver (tokens only), on
one 2-stage SmolLM2 route on 127.0.0.1, in interleaved rounds.

    .venv/bin/python bench/gateway_bench.py [--bin-dir DIR] [--rounds 7] [--tokens 64]
        [--threads 1] [--prompt TEXT] [--json out.json]

Per round, each path runs once (the order turns each round): TTFT is from the call to the
first generated token (the driver's on_token; the gateway's first content chunk, so the
gateway's figure includes HTTP, admission, the prompt's tokenize and detokenizing the
first token), decode tok/s is (tokens - 1) over the time from the first token to the last
(the gateway's token count from its usage chunk).
Printed: best and median per path, and against `meshnet generate` and the driver the
median of the per-round ratios gateway / other (decode speed) and the median and p90 of
the per-round differences gateway - other (TTFT), which is what the goal is about:
>= 95% of the decode tok/s, < 5 ms added to TTFT.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.local.process import LaunchSpec, free_port, route_key_of, start_route, worker_binary
from meshnet.route import RouteDriver

PROMPT = ("The history of the printing press begins in the fifteenth century, when movable "
          "type changed how books were made, sold and read across Europe and beyond.")
MODEL = "smollm2"


def via_driver(driver: RouteDriver, prompt: str, tokens: int, as_text: bool,
               ) -> tuple[float, float, int]:
    """The driver's tokens as they come; `as_text`: each one turned into the text so far
    first, as `meshnet generate` prints them (a Detokenize of the whole answer per token)."""
    stamps: list[float] = []
    generated: list[int] = []

    def arrived(token: int) -> None:
        if as_text:
            generated.append(token)
            driver.detokenize(generated)
        stamps.append(time.perf_counter())

    start = time.perf_counter()
    driver.generate(prompt, max_tokens=tokens, stop_at_eos=False, on_token=arrived)
    return figures(start, stamps)


def via_gateway(client: httpx.Client, url: str, prompt: str, tokens: int,
                ) -> tuple[float, float, int]:
    """One streaming request on a kept-alive connection (as the openai client pools them:
    a fresh httpx client per request alone costs tens of milliseconds)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    stamps: list[float] = []
    generated = 0
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
    # a chunk may carry several tokens (those that arrived while the last was sent)
    return figures(start, stamps[:1] + stamps[-1:], generated)


def figures(start: float, stamps: list[float], tokens: int | None = None,
            ) -> tuple[float, float, int]:
    """(TTFT ms, decode tok/s, tokens) from the arrival times of the first and last token."""
    tokens = len(stamps) if tokens is None else tokens
    if len(stamps) < 2 or tokens < 2:
        raise RuntimeError(f"only {len(stamps)} pieces arrived")
    return (stamps[0] - start) * 1000, (tokens - 1) / (stamps[-1] - stamps[0]), tokens


def start_gateway(endpoints: list[str], log: Path,
                  route_key_file: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [sys.executable, "-m", "meshnet.cli", "serve", "--model", MODEL,
            "--listen", f"127.0.0.1:{port}"]
    if route_key_file:
        args += ["--route-key-file", str(route_key_file)]
    for endpoint in endpoints:
        args += ["--stage", endpoint]
    process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"meshnet serve was not ready: {log.read_text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt", default=PROMPT,
                        help="a short one ('Hi') shrinks the prefill, and with it the noise "
                             "a busy machine adds to the paired TTFT")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    binary = args.bin_dir / "meshnet-shard-worker" if args.bin_dir else worker_binary()
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    specs = [LaunchSpec(model=smollm2_gguf(), layers=LayerRange(*span), route_id="bench/gateway",
                        threads=args.threads) for span in [(0, 15), (15, 30)]]
    workers = start_route(binary, specs, work, chain=True)
    gateway, url = start_gateway([w.endpoint for w in workers], work / "serve.log",
                                 workers[0].spec.route_key_file)
    paths = ["driver", "generate", "gateway"]
    results: dict[str, list[tuple[float, float, int]]] = {path: [] for path in paths}
    try:
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers)) as driver, httpx.Client() as client:
            driver.connect(wait=30)
            via_driver(driver, args.prompt, 8, as_text=True)  # warm both paths once
            via_gateway(client, url, args.prompt, 8)
            for round_no in range(args.rounds):
                for path in paths[round_no % 3:] + paths[:round_no % 3]:  # the order turns
                    run = (via_gateway(client, url, args.prompt, args.tokens)
                           if path == "gateway" else
                           via_driver(driver, args.prompt, args.tokens,
                                      as_text=path == "generate"))
                    results[path].append(run)
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)
        for worker in workers:
            worker.stop()
    report(results, args)
    return 0


def percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ordered list."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def report(results: dict[str, list[tuple[float, float, int]]], args: argparse.Namespace) -> None:
    print(f"2-stage SmolLM2 route (0:15,15:30, {args.threads} thread(s) per stage), "
          f"{args.tokens} greedy tokens, {args.rounds} interleaved rounds")
    print(f"{'path':<10}{'TTFT ms best':>14}{'median':>9}{'decode tok/s best':>19}{'median':>9}")
    summary: dict[str, Any] = {}
    for path, runs in results.items():
        ttft = [r[0] for r in runs]
        speed = [r[1] for r in runs]
        print(f"{path:<10}{min(ttft):>14.1f}{statistics.median(ttft):>9.1f}"
              f"{max(speed):>19.1f}{statistics.median(speed):>9.1f}")
        summary[path] = {"ttft_ms": ttft, "decode_tokens_per_second": speed}
    summary["paired"] = {}
    for base in ("generate", "driver"):
        pairs = list(zip(results["gateway"], results[base], strict=True))
        ratio = statistics.median(g[1] / d[1] for g, d in pairs)
        added = sorted(g[0] - d[0] for g, d in pairs)
        median, p90 = statistics.median(added), percentile(added, 0.9)
        print(f"paired against {base}: gateway decode = {ratio * 100:.1f}% (goal >= 95%), "
              f"TTFT {median:+.1f} ms median, {p90:+.1f} ms p90 (goal < 5 ms)")
        summary["paired"][base] = {"decode_ratio": ratio, "ttft_added_ms": median,
                                   "ttft_added_ms_p90": p90}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
