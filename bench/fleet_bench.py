"""A route's replicas behind one gateway: aggregate decode throughput of 1 vs 2 replicas at
N concurrent sessions, and how long the sessions of a replica that dies wait before the
other replica serves them. Two 2-stage SmolLM2 pipelines (chains) on 127.0.0.1.

    .venv/bin/python bench/fleet_bench.py [--bin-dir DIR] [--rounds 3] [--sessions 16]
        [--tokens 32] [--threads 1] [--json out.json]

Throughput: one gateway serving replica 0 alone (`--replica`), one serving replicas 0 and
1; per round each runs N concurrent greedy completions of `--tokens` tokens (the order
turns each round), and its figure is the tokens generated over the wall time of the batch.
Both pipelines run all the time, so the machine's load differs only by the work done.
Fail-over: through the 2-replica gateway, N streaming sessions; once every one has its
first tokens, replica 1's last stage is killed (SIGKILL). A moved session's stall is the
time from the kill to its first token after it (detected, re-prefilled on replica 0 with the
prompt and the tokens so far, decoding again); its text must equal the session's text in
the throughput rounds. The stage is restarted before the next round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    free_port,
    new_route_key_file,
    start_route,
    worker_binary,
)

MODEL = "smollm2"
PROMPTS = ["The history of the printing press begins", "Once upon a time, in a small village,",
           "The capital of France is", "def fibonacci(n):"]


def start_gateway(replicas: list[list[WorkerProcess]], log: Path,
                  ) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [sys.executable, "-m", "meshnet.cli", "serve", "--model", MODEL,
            "--listen", f"127.0.0.1:{port}", "--max-waiting", "64",
            "--route-key-file", str(replicas[0][0].spec.route_key_file)]
    for workers in replicas:
        args += ["--replica", ",".join(w.endpoint for w in workers)]
    process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, len(replicas))
    return process, url


def wait_ready(url: str, replicas: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ready = httpx.get(url + "/ready", timeout=1)
            if ready.status_code == 200 and ready.json().get("replicas") == replicas:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {url} never had {replicas} replicas ready")


def body(prompt: str, tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def batch(url: str, sessions: int, tokens: int) -> tuple[float, list[str]]:
    """N concurrent completions: aggregate tokens/s, and their texts."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(sessions)]
    start = time.perf_counter()
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(sessions) as pool:
        answers = list(pool.map(
            lambda p: client.post(url + "/v1/completions", json=body(p, tokens)).json(),
            prompts))
    wall = time.perf_counter() - start
    generated = sum(a["usage"]["completion_tokens"] for a in answers)
    return generated / wall, [a["choices"][0]["text"] for a in answers]


def failover(url: str, sessions: int, tokens: int, victim: WorkerProcess,
             ) -> tuple[list[float], list[str]]:
    """N streams; the victim killed once each has a token: each stream's wait from the
    kill to its next token, and the texts."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(sessions)]
    started = threading.Barrier(sessions + 1)
    killed_at: list[float] = []

    def stream(prompt: str) -> tuple[float, str]:
        pieces: list[str] = []
        waited = 0.0
        with httpx.Client(timeout=600) as client, client.stream(
                "POST", url + "/v1/completions", json=body(prompt, tokens, True)) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                pieces.append(chunk["choices"][0]["text"])
                if len(pieces) == 2:
                    started.wait()
                if killed_at and not waited:
                    waited = time.perf_counter() - killed_at[0]
        return waited, "".join(pieces)

    with ThreadPoolExecutor(sessions) as pool:
        runs = [pool.submit(stream, p) for p in prompts]
        started.wait()
        killed_at.append(time.perf_counter())
        victim.kill()
        results = [r.result() for r in runs]
    return [w for w, _ in results], [t for _, t in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    binary = args.bin_dir / "meshnet-shard-worker" if args.bin_dir else worker_binary()
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    specs = [LaunchSpec(model=smollm2_gguf(), layers=LayerRange(*span), route_id="bench/fleet",
                        threads=args.threads, slots=args.sessions, ctx=1024)
             for span in [(0, 15), (15, 30)]]
    # replicas of one route: one key
    key_file = new_route_key_file(work)
    specs = [replace(spec, route_key_file=key_file) for spec in specs]
    for r in (0, 1):
        (work / f"replica-{r}").mkdir()
    replicas = [start_route(binary, specs, work / f"replica-{r}", chain=True) for r in (0, 1)]
    gateways = {"1 replica": start_gateway(replicas[:1], work / "serve-1.log"),
                "2 replicas": start_gateway(replicas, work / "serve-2.log")}
    speeds: dict[str, list[float]] = {name: [] for name in gateways}
    stalls: list[float] = []
    try:
        for _, url in gateways.values():  # warm both
            batch(url, 2, 4)
        names = list(gateways)
        texts: list[str] = []
        for round_no in range(args.rounds):
            for name in names[round_no % 2:] + names[:round_no % 2]:  # the order turns
                speed, batch_texts = batch(gateways[name][1], args.sessions, args.tokens)
                speeds[name].append(speed)
                assert not texts or batch_texts == texts, "a text differs between runs"
                texts = batch_texts
        url = gateways["2 replicas"][1]
        for _ in range(args.rounds):
            waited, moved_texts = failover(url, args.sessions, args.tokens, replicas[1][-1])
            assert moved_texts == texts, "a moved session's text differs"
            stalls.append(max(waited))
            replicas[1][-1].start()
            wait_ready(url, 2)
    finally:
        for process, _ in gateways.values():
            process.terminate()
            process.wait(timeout=10)
        for workers in replicas:
            for worker in workers:
                worker.stop()
    print(f"2 pipelines of a 2-stage SmolLM2 route (0:15,15:30, {args.threads} thread(s) per "
          f"stage, {args.sessions} slots each), {args.sessions} concurrent sessions of "
          f"{args.tokens} greedy tokens, {args.rounds} interleaved rounds")
    for name, runs in speeds.items():
        print(f"{name:<11} aggregate tok/s: median {statistics.median(runs):.1f} "
              f"(rounds: {', '.join(f'{s:.1f}' for s in runs)})")
    print(f"a replica killed under {args.sessions} sessions: the longest wait of a session "
          f"from the kill to its next token: median {statistics.median(stalls) * 1000:.0f} ms "
          f"(rounds: {', '.join(f'{s * 1000:.0f}' for s in stalls)}); every text as before")
    if args.json:
        args.json.write_text(json.dumps({"tokens_per_second": speeds,
                                         "failover_stall_seconds": stalls}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
