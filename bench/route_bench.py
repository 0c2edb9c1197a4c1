"""Data-plane benchmark: a 2-stage loopback route vs the unsplit model vs llama.cpp's RPC
backend, and 8 concurrent sessions vs 1 (SmolLM2-135M Q4_1, same total threads).

    .venv/bin/python bench/route_bench.py [--bin-dir DIR]
        [--threads 2] [--repeats 5] [--split 18] [--pin] [--json out.json]

Prints one table: best (and median) of --repeats interleaved rounds of a 128-token
prompt and 64 decoded tokens (greedy); every setup runs once per round, in an order that
turns by one setup each round, so background load hits them alike, and the "paired"
columns give the median over rounds of each setup's speed divided by the reference's in
the same round (the machine's speed drifts between rounds; within one round it drifts
less). Threads: the unsplit model gets
--threads; each of the two stages and each of the two ggml-rpc-server processes gets
--threads / 2. One more row gives each stage all --threads: while one session decodes,
only one stage computes at a time. Both stages split the model at --split (default
0:18,18:30: the last stage also carries the output head, as costly as about six layers
in a step of four sessions, so an even 15/15 split leaves the first stage idle a third
of the time while 8 sessions decode).
The hop-floor line says what the hand-offs alone cost on this host (bench/hop_floor.py),
and the gRPC-floor line what they cost over gRPC with the worker's threads and nothing
else (meshnet-grpc-hop, measured once per round), so the "outside engines" column can
be read against both.
The 8-session line also gives 8 sessions with batch invariance off (--batching throughput,
as upstream batches) and with each session stepping alone (--exact-batch-rows 1, what a
stage gets whose start-up probe found shared steps inexact), paired against the exact
shared steps. The 8-vs-1 line also says how busy each stage's engine was while all 8 sessions
decoded (/metrics: meshnet_shard_engine_busy_seconds_total) and what each token cost
it: the slower stage's cost per token bounds what any pipeline of these two stages can
reach on this machine.
--pin binds every process measured to CPUs (meshnet.local.process.cpu_binding_env): each
one running --threads threads to the first --threads CPUs, a stage or rpc-server of
--threads / 2 threads to CPUs of its own, so both sides of the comparison are bound alike.
Run it without GOMP_SPINCOUNT: the workers then get the launcher's default
(meshnet.local.process.WORKER_ENV_DEFAULTS) and llama.cpp's own processes (the reference,
the rpc servers) libgomp's, as a user runs them; set, it applies to every process
measured. --omp-passive sleeps finished OpenMP threads at once (slower: ggml
synchronises once per graph node).

    .venv/bin/python bench/route_bench.py --lane vulkan [--repeats 2] [--tokens 8]

--lane vulkan|cuda|rocm measures instead what exactness costs on the lane's device, every
layer offloaded (`make vulkan` builds the vulkan worker): the 2-stage chain on our kernel
paths with exact batching and with --batching throughput, on vulkan also on upstream's
paths (MESHNET_VK_UPSTREAM_PATHS=1, patch 0022, same build) batching as upstream does, and
the model unsplit on one stage; one session and 8 at once, --tokens decoded tokens each, in
interleaved rounds, with what each route's start-up probe measured. On Mesa's software
device (no GPU) the figures compare setups inside one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hop_floor import grpc_hop_floor_ms, hop_floor_ms
from lane_paths import (
    KERNELS,
    LANES,
    device_note,
    exactness,
    lane_binary,
    lane_gpu_layers,
)

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.local.process import (
    WORKER_ENV_DEFAULTS,
    LaunchSpec,
    WorkerProcess,
    cpu_binding_env,
    free_port,
    route_key_of,
    start_route,
    worker_binary,
)
from meshnet.paths import workspace
from meshnet.route import RouteDriver

PROMPT_TOKENS = 128
DECODE_TOKENS = 64
# Batch invariance off: any mix of steps shares an engine step, as upstream batches (the
# worker's default shares up to its measured exact step, 8 rows on the CPU).
ANY_MIX = ("--batching", "throughput")
# Each session steps alone: what a device whose shared steps are not exact gets (a claimed
# exact step of one row: no two sessions' rows may share one).
ALONE = ("--exact-batch-rows", "1")
TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable "
    "type changed how books were made, sold and read across Europe and beyond. "
)


def smollm2() -> Path:
    return smollm2_gguf()


def summary(values: list[float]) -> dict[str, float]:
    """Best and median of the rounds (background load only ever slows a round down)."""
    return {"best": round(max(values), 1), "median": round(statistics.median(values), 1)}


def paired(pairs: list[tuple[float, float]]) -> float:
    """Median over rounds of value / reference, each pair measured in the same round."""
    return statistics.median(value / reference for value, reference in pairs if reference > 0)


def prompt_ids(driver: RouteDriver) -> list[int]:
    ids: list[int] = []
    while len(ids) < PROMPT_TOKENS:
        ids += driver.tokenize(TEXT)
    return ids[:PROMPT_TOKENS]


def measure_route(driver: RouteDriver, prompt: list[int],
                  overheads: list[float] | None = None) -> tuple[float, float]:
    """(prefill, decode) tokens/s of one 128-token prompt and 64 decoded tokens; appends
    to `overheads` the decode's milliseconds per token outside the engines (network,
    hand-offs, driver), which the machine's drifting speed hardly moves."""
    generation = driver.generate(prompt, max_tokens=DECODE_TOKENS, stop_at_eos=False)
    if overheads is not None:
        steps = max(1, len(generation.tokens) - 1)
        overheads.append(
            1e3 * (generation.decode_seconds - generation.decode_engine_seconds) / steps)
    return generation.prefill_tokens_per_second, generation.decode_tokens_per_second


def measure_reference(tool: Path, model: Path, prompt: list[int], threads: int,
                      gpu_layers: int = 0, cpus: tuple[int, ...] = ()) -> tuple[float, float]:
    result = subprocess.run(
        [str(tool), "--model", str(model), "--prompt-tokens", ",".join(map(str, prompt)),
         "-n", str(DECODE_TOKENS), "--threads", str(threads), "--gpu-layers", str(gpu_layers)],
        capture_output=True, text=True, check=True, timeout=600,
        env={**os.environ, **cpu_binding_env(cpus)},
    )
    data = json.loads(result.stdout)
    return data["prefill_tokens_per_second"], data["decode_tokens_per_second"]


def llama_bench(args: list[str]) -> tuple[float, float]:
    """(pp128, tg64) tokens/s of one llama-bench round."""
    tool = workspace() / "llama-build" / "install" / "bin" / "llama-bench"
    result = subprocess.run(
        [str(tool), *args, "-p", str(PROMPT_TOKENS), "-n", str(DECODE_TOKENS), "-r", "1",
         "-o", "json"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({result.returncode}): {result.stderr[-800:]}")
    rows = {("pp" if row["n_prompt"] else "tg"): row["avg_ts"] for row in json.loads(result.stdout)}
    return rows["pp"], rows["tg"]


class RpcServers:
    """Two ggml-rpc-server processes on loopback (llama.cpp's RPC backend)."""

    def __init__(self, threads_each: int, cpus: list[tuple[int, ...]] | None = None) -> None:
        server = workspace() / "llama-build" / "install" / "bin" / "ggml-rpc-server"
        self.ports = [free_port(), free_port()]
        self.processes = [
            subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port), "-t",
                              str(threads_each)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, **cpu_binding_env(cpus[i] if cpus else ())})
            for i, port in enumerate(self.ports)
        ]
        self.threads_each = threads_each
        time.sleep(1.0)

    def measure(self, model: Path) -> tuple[float, float]:
        endpoints = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return llama_bench(["-m", str(model), "--rpc", endpoints, "-ngl", "99",
                            "-t", str(self.threads_each), "--repack", "0"])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(10)


def stage_counters(metrics_port: int) -> tuple[float, float]:
    """(engine busy seconds, token positions processed) of one worker, from /metrics."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        values = {}
        for line in answer.read().decode().splitlines():
            name, _, value = line.partition(" ")
            values[name] = value
    return (float(values["meshnet_shard_engine_busy_seconds_total"]),
            float(values["meshnet_shard_tokens_processed_total"]))


class StageSampler:
    """Samples every stage's counters every 20 ms in the background, so that the busy
    share and cost per token of each stage can be read for any window afterwards."""

    def __init__(self, workers: list[WorkerProcess]) -> None:
        self.ports = [worker.metrics_port for worker in workers]
        self.samples: list[tuple[float, list[tuple[float, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), [stage_counters(p) for p in self.ports]))
            self._stop.wait(0.02)

    def __enter__(self) -> StageSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, start: float, end: float) -> list[dict[str, float]]:
        """Per stage, between the first sample after `start` and the last before `end`:
        the share of the time its engine was busy and its engine ms per token."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return []
        (t0, first), (t1, last) = inside[0], inside[-1]
        stages = []
        for (busy0, tokens0), (busy1, tokens1) in zip(first, last, strict=True):
            busy, tokens = busy1 - busy0, tokens1 - tokens0
            stages.append({"busy_share": round(busy / (t1 - t0), 3),
                           "ms_per_token": round(1e3 * busy / tokens, 3) if tokens else 0.0})
        return stages


def concurrent_decode(driver: RouteDriver, prompt: list[int], sessions: int,
                      workers: list[WorkerProcess] | None = None, tokens: int = DECODE_TOKENS,
                      prefix: int = 32) -> tuple[float, list[dict[str, float]]]:
    """Aggregate decode tokens/s of `sessions` generations running at once, over the
    window in which every one of them is decoding (after the last prefill, before the
    first finish), so that neither prefills nor stragglers count as decode time; and,
    given the route's `workers`, each stage's busy share and cost per token in it."""
    def one(index: int) -> list[float]:
        own_prompt = [*prompt[:prefix], index + 10]  # distinct sessions, equal work
        times: list[float] = []
        driver.generate(own_prompt, max_tokens=tokens, stop_at_eos=False,
                        on_token=lambda _token: times.append(time.perf_counter()))
        return times

    with StageSampler(workers or []) as sampler, ThreadPoolExecutor(sessions) as pool:
        runs = list(pool.map(one, range(sessions)))
    start = max(times[0] for times in runs)  # the first token comes from the prefill
    end = min(times[-1] for times in runs)
    tokens = sum(1 for times in runs for t in times if start < t <= end)
    rate = round(tokens / (end - start), 1) if end > start else 0.0
    return rate, sampler.window(start, end) if workers else []


def run(bin_dir: Path | None, threads: int, repeats: int, model: Path | None = None,
        gpu_layers: int = 0, split: int = 18, pin: bool = False) -> dict[str, Any]:
    """Starts every setup at once (idle ones cost no CPU), then measures them in turn,
    round after round, so a burst of background load hits every setup alike."""
    binary = bin_dir / "meshnet-shard-worker" if bin_dir else worker_binary()
    reference_tool = binary.parent / "meshnet-reference-generate"
    model = model or smollm2()
    half = max(1, threads // 2)
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    results: dict[str, Any] = {"threads_total": threads, "load_average": os.getloadavg(),
                               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                               "gomp_spincount": os.environ.get("GOMP_SPINCOUNT") or (
                                   f"workers {WORKER_ENV_DEFAULTS['GOMP_SPINCOUNT']}, "
                                   "llama.cpp default"),
                               "rounds": repeats, "gpu_layers": gpu_layers, "split": split,
                               "pinned": pin}
    available = sorted(os.sched_getaffinity(0))

    def cpus(n_threads: int, index: int = 0) -> tuple[int, ...]:
        """With --pin, the CPUs of the index-th process running n_threads threads."""
        if not pin:
            return ()
        return tuple(available[(index * n_threads + i) % len(available)] for i in range(n_threads))

    def spec(span: tuple[int, int], n_threads: int, index: int = 0,
             extra: tuple[str, ...] = ()) -> LaunchSpec:
        return LaunchSpec(model=model, layers=LayerRange(*span), threads=n_threads, slots=8,
                          ctx=1024,
                          gpu_layers=gpu_layers, cpus=cpus(n_threads, index), extra=extra)

    first, second = (0, split), (split, 30)
    setups = {  # name: (specs, chain)
        "unsplit_worker": ([spec((0, 30), threads)], False),
        "route_2_stages": ([spec(first, half), spec(second, half, 1)], False),
        "route_2_stages_chain": ([spec(first, half), spec(second, half, 1)], True),
        "route_2_stages_chain_all_threads": (
            [spec(first, threads), spec(second, threads)], True),
    }
    workers: list[WorkerProcess] = []
    route_workers: dict[str, list[WorkerProcess]] = {}
    drivers: dict[str, RouteDriver] = {}
    rpc: RpcServers | None = None
    try:
        for name, (specs, chain) in setups.items():
            started = start_route(binary, specs, logs, chain=chain)
            workers += started
            route_workers[name] = started
            drivers[name] = RouteDriver([w.endpoint for w in started],
                                        route_key=route_key_of(started),
                                        topology="chain" if chain else "hub")
            drivers[name].connect(wait=30)
        prompt = prompt_ids(drivers["unsplit_worker"])
        for driver in drivers.values():
            driver.generate(prompt[:8], max_tokens=4, stop_at_eos=False)  # warm up
        rpc = RpcServers(half, [cpus(half, 0), cpus(half, 1)] if pin else None)
        rounds: dict[str, list[tuple[float, float]]] = {}
        overheads: dict[str, list[float]] = {}
        grpc_floors: list[float] = []
        hop_tool = binary.parent / "meshnet-grpc-hop"
        # Each round runs every setup once, starting one setup later than the round
        # before: on the VM the setup run right after another process exits was up to 9%
        # slower than an identical one run later, so no setup always takes that place.
        setups_measured: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("unsplit_llama_cpp", lambda: measure_reference(
                reference_tool, model, prompt, threads, gpu_layers, cpus(threads))),
            *((name, partial(measure_route, driver, prompt, overheads.setdefault(name, [])))
              for name, driver in drivers.items()),
            ("llama_cpp_rpc_2_servers", lambda: rpc.measure(model)),
        ]
        for round_index in range(repeats):
            start = round_index % len(setups_measured)
            for name, measure in setups_measured[start:] + setups_measured[:start]:
                try:
                    rounds.setdefault(name, []).append(measure())
                except (RuntimeError, subprocess.SubprocessError) as exc:
                    if name != "llama_cpp_rpc_2_servers":
                        raise
                    results["llama_cpp_rpc_2_servers_error"] = str(exc)[-300:]
            try:  # each stage computes about half the reference's token of this round
                grpc_floors.append(grpc_hop_floor_ms(
                    str(hop_tool), 1e3 / rounds["unsplit_llama_cpp"][-1][1] / 2, threads,
                    env={**WORKER_ENV_DEFAULTS, **os.environ}))
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                results["grpc_floor_error"] = str(exc)[-300:]
        # Each stage computes about half the unsplit model's token.
        reference_ms = 1e3 / summary([v[1] for v in rounds["unsplit_llama_cpp"]])["best"]
        try:
            results["hop_floor_ms_per_token"] = round(hop_floor_ms(reference_ms / 2), 3)
        except (OSError, subprocess.SubprocessError) as exc:
            results["hop_floor_error"] = str(exc)[-300:]
        if grpc_floors:
            results["grpc_floor_ms_per_token"] = round(statistics.median(grpc_floors), 3)
        for name, values in rounds.items():
            results[name] = {"prefill": summary([v[0] for v in values]),
                             "decode": summary([v[1] for v in values]),
                             "rounds": values}
            if name in overheads:
                results[name]["decode_overhead_ms_per_token"] = round(
                    statistics.median(overheads[name]), 3)
        chain_driver = drivers["route_2_stages_chain"]
        chain_workers = route_workers["route_2_stages_chain"]
        # The same chain without batch invariance (what exact tokens under load cost), and
        # with each session stepping alone (what a device without exact shared steps gets).
        for name, extra in (("any_mix", ANY_MIX), ("alone", ALONE)):
            variant = start_route(binary, [spec(first, half, extra=extra),
                                           spec(second, half, 1, extra=extra)], logs, chain=True)
            workers += variant
            drivers[name] = RouteDriver([w.endpoint for w in variant],
                                         route_key=route_key_of(variant), topology="chain")
            drivers[name].connect(wait=30)
        concurrent_decode(chain_driver, prompt, 2)  # warm up
        concurrent_decode(drivers["any_mix"], prompt, 2)
        concurrent_decode(drivers["alone"], prompt, 2)
        ones, eights, eights_any_mix, eights_alone = [], [], [], []
        stages_one, stages_eight = [], []
        for _ in range(repeats):
            rate, stages = concurrent_decode(chain_driver, prompt, 1, chain_workers)
            ones.append(rate)
            stages_one.append(stages)
            rate, stages = concurrent_decode(chain_driver, prompt, 8, chain_workers)
            eights.append(rate)
            stages_eight.append(stages)
            eights_any_mix.append(concurrent_decode(drivers["any_mix"], prompt, 8)[0])
            eights_alone.append(concurrent_decode(drivers["alone"], prompt, 8)[0])
        results["route_2_stages_sessions"] = {
            "1": summary(ones), "8": summary(eights), "8_any_mix": summary(eights_any_mix),
            "paired_ratio": round(paired([(e, o) for e, o in zip(eights, ones, strict=True)]), 2),
            "paired_exact_vs_any_mix": round(paired(
                [(e, a) for e, a in zip(eights, eights_any_mix, strict=True)]), 3),
            "8_alone": summary(eights_alone),
            "paired_alone_vs_exact": round(paired(
                [(a, e) for a, e in zip(eights_alone, eights, strict=True)]), 3),
            "stages_1": median_stages(stages_one), "stages_8": median_stages(stages_eight)}
    finally:
        if rpc:
            rpc.stop()
        for driver in drivers.values():
            driver.close()
        for worker in workers:
            worker.stop()
    return results


def median_stages(rounds: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per stage, the median over rounds of each figure of `StageSampler.window`."""
    measured = [stages for stages in rounds if stages]
    if not measured:
        return []
    return [{key: round(statistics.median(stages[i][key] for stages in measured), 3)
             for key in measured[0][i]} for i in range(len(measured[0]))]


@dataclass(frozen=True)
class LaneChain:
    """A route measured on a GPU lane: its kernel paths (lane_paths.KERNELS), its batching,
    and whether it is the 2-stage chain or the model unsplit on one stage."""

    kernels: str
    batching: str  # "exact" or "throughput"
    split: bool = True


# On a GPU lane: each route, and the setups measured in each round (label, route, sessions at
# once). Upstream's paths batch as upstream does (their probe says what it found); only the
# vulkan lane has them (patch 0022), so only there are they measured.
LANE_PREFIX = 6  # prompt tokens of each session, before its own last one
LANE_CHAINS = {
    "exact": LaneChain("exact paths", "exact"),
    "throughput": LaneChain("exact paths", "throughput"),
    "upstream": LaneChain("upstream paths", "throughput"),
    "unsplit": LaneChain("exact paths", "exact", split=False),
}
LANE_SETUPS = [
    ("1 session, unsplit (one stage), exact paths", "unsplit", 1),
    ("1 session, exact paths", "exact", 1),
    ("1 session, upstream paths", "upstream", 1),
    ("8 sessions, exact paths, exact batching", "exact", 8),
    ("8 sessions, exact paths, --batching throughput", "throughput", 8),
    ("8 sessions, upstream paths, --batching throughput", "upstream", 8),
]


def lane_setups(lane: str) -> list[tuple[str, str, int]]:
    return [setup for setup in LANE_SETUPS if lane == "vulkan" or setup[1] != "upstream"]


def run_lane(binary: Path, lane: str, threads: int, repeats: int, split: int,
             tokens: int) -> dict[str, Any]:
    """On a GPU lane, every layer on the device: a 2-stage chain (threads / 2 each) on our
    kernel paths with exact batching and with --batching throughput, on vulkan also on
    upstream's paths (patch 0022) batching as upstream does, and the model unsplit on one
    stage (all threads); in each round one session and 8 at once, in an order that turns
    by one setup each round."""
    model = smollm2()
    half = max(1, threads // 2)
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    workers: list[WorkerProcess] = []
    drivers: dict[str, RouteDriver] = {}
    setups = lane_setups(lane)
    results: dict[str, Any] = {"lane": lane, "note": device_note(lane), "threads_total": threads,
                               "rounds": repeats, "split": split, "tokens": tokens,
                               "load_average": os.getloadavg(), "exactness": {}}
    try:
        for name in dict.fromkeys(chain for _, chain, _ in setups):
            chain = LANE_CHAINS[name]
            # A chain that batches as upstream skips the start-up probe (minutes per stage
            # on the software device): without speculation nothing here reads its result.
            extra = (*ANY_MIX, "--exact-batch-rows", "0") if chain.batching == "throughput" else ()
            spans = ((0, split), (split, 30)) if chain.split else ((0, 30),)
            specs = [LaunchSpec(model=model, layers=LayerRange(*span),
                                threads=half if chain.split else threads, slots=8, ctx=512,
                                gpu_layers=lane_gpu_layers(lane), extra=extra)
                     for span in spans]
            stages = start_route(binary, specs, logs, timeout=900, chain=True,
                                 env=KERNELS[chain.kernels])
            workers += stages
            driver = RouteDriver([w.endpoint for w in stages], route_key=route_key_of(stages),
                                 topology="chain")
            route = driver.connect(wait=60)
            drivers[name] = driver
            results["exactness"][name] = exactness(route.stages)
        prompt = prompt_ids(drivers["exact"])
        # Short prompts: the software device compiles each shader at its first use, the
        # wide-step matrix products for minutes under load, past a first step's deadline.
        # A 3-token step first, so the stage's step deadline is measured before wider ones.
        measured = partial(concurrent_decode, prompt=prompt, tokens=tokens, prefix=LANE_PREFIX)
        for driver in drivers.values():
            driver.generate(prompt[:3], max_tokens=2, stop_at_eos=False)
            measured(driver, sessions=8, tokens=2)  # warm up
        rates: dict[str, list[float]] = {label: [] for label, _, _ in setups}
        for round_index in range(repeats):
            start = round_index % len(setups)
            for label, chain_name, sessions in setups[start:] + setups[:start]:
                rate, _ = measured(drivers[chain_name], sessions=sessions)
                rates[label].append(rate)
                print(f"  round {round_index + 1}: {label}: {rate:.2f} tok/s", flush=True)
        results["setups"] = {label: {**summary(values), "rounds": values}
                             for label, values in rates.items()}
    finally:
        for driver in drivers.values():
            driver.close()
        for worker in workers:
            worker.stop()
    return results


def lane_report(results: dict[str, Any]) -> str:
    setups = results["setups"]

    def ratio(label: str, reference: str) -> float:
        return paired(list(zip(setups[label]["rounds"], setups[reference]["rounds"],
                               strict=True)))

    lines = [
        results["note"],
        (f"SmolLM2-135M Q4_1, 2-stage chain 0:{results['split']},{results['split']}:30, "
         f"{results['threads_total']} threads in total, {LANE_PREFIX + 1}-token prompts, "
         f"{results['tokens']} decoded tokens a session, aggregate decode tok/s, best of "
         f"{results['rounds']} interleaved rounds (median in brackets); paired: median over "
         "rounds of the ratio within a round; load "
         f"average at start {', '.join(f'{x:.2f}' for x in results['load_average'])}"),
        *(f"  start-up probe, {name}: {found}" for name, found in results["exactness"].items()),
    ]
    for label, row in setups.items():
        lines.append(f"{label:<52}{row['best']:>8.2f} ({row['median']:.2f})")
    exact = "8 sessions, exact paths, exact batching"
    lines += [
        ("2-stage route, one session: x"
         f"{ratio('1 session, exact paths', '1 session, unsplit (one stage), exact paths'):.3f}"
         " of the unsplit model (paired)"),
        (f"8 sessions, exact batching: x"
         f"{ratio(exact, '8 sessions, exact paths, --batching throughput'):.3f} of our paths "
         "with --batching throughput (paired)"),
    ]
    if "1 session, upstream paths" in setups:
        upstream = "8 sessions, upstream paths, --batching throughput"
        lines += [
            ("exact paths, one session: x"
             f"{ratio('1 session, exact paths', '1 session, upstream paths'):.3f} of upstream's "
             "paths (paired)"),
            (f"8 sessions, exact paths and exact batching: x{ratio(exact, upstream):.3f} of "
             "upstream as is (its paths, --batching throughput) (paired)"),
        ]
    return "\n".join(lines)


def report(results: dict[str, Any]) -> str:
    base = results["unsplit_llama_cpp"]
    lines = [
        (f"SmolLM2-135M Q4_1, prompt {PROMPT_TOKENS} tokens, decode {DECODE_TOKENS} tokens, "
        f"{results['threads_total']} threads in total, gpu layers {results['gpu_layers']}, "
        f"2-stage split 0:{results['split']},{results['split']}:30, "
        f"{'bound to CPUs (--pin)' if results.get('pinned') else 'unbound'}, "
        "OMP_WAIT_POLICY="
        f"{results['omp_wait_policy'] or 'default'}, GOMP_SPINCOUNT="
        f"{results['gomp_spincount'] or 'default'}, load average at start "
        f"{', '.join(f'{x:.2f}' for x in results['load_average'])}"),
        f"best of {results['rounds']} interleaved rounds (median in brackets); % of the "
        "reference's best, and paired: median over rounds of the ratio within a round",
        f"{'setup':<36}{'prefill tok/s':>22}{'%':>7}{'paired':>8}{'decode tok/s':>20}{'%':>7}"
        f"{'paired':>8}{'outside engines ms/token':>26}",
    ]
    rows = [
        ("unsplit llama.cpp (reference)", "unsplit_llama_cpp"),
        ("unsplit, 1 worker (our service)", "unsplit_worker"),
        ("2-stage route, hub, 1+1 threads", "route_2_stages"),
        ("2-stage chain+loop, 1+1 threads", "route_2_stages_chain"),
        ("2-stage chain+loop, 2+2 threads", "route_2_stages_chain_all_threads"),
        ("llama.cpp RPC, 2 rpc-servers, 1+1", "llama_cpp_rpc_2_servers"),
    ]
    for label, key in rows:
        if key not in results:
            lines.append(f"{label:<36}  error: {results.get(key + '_error', 'not measured')}")
            continue
        row = results[key]
        prefill, decode = row["prefill"], row["decode"]
        pairs = list(zip(row["rounds"], base["rounds"], strict=False))
        paired_prefill = paired([(v[0], b[0]) for v, b in pairs])
        paired_decode = paired([(v[1], b[1]) for v, b in pairs])
        lines.append(
            f"{label:<36}{prefill['best']:>12.1f} ({prefill['median']:>6.1f})"
            f"{100 * prefill['best'] / base['prefill']['best']:>6.1f}%{100 * paired_prefill:>7.1f}%"
            f"{decode['best']:>10.1f} ({decode['median']:>6.1f})"
            f"{100 * decode['best'] / base['decode']['best']:>6.1f}%{100 * paired_decode:>7.1f}%"
            + (f"{row['decode_overhead_ms_per_token']:>26.2f}"
               if "decode_overhead_ms_per_token" in row else "")
        )
    reference_ms = 1e3 / base["decode"]["best"]
    for key, label, what in (
        ("hop_floor", "hop floor", "bench/hop_floor.py: two processes taking turns over "
                                   "loopback TCP, no gRPC"),
        ("grpc_floor", "gRPC floor", "meshnet-grpc-hop: the same turns over one gRPC Relay "
                                     "stream, the worker's threads, no model; median of rounds"),
    ):
        floor = results.get(f"{key}_ms_per_token")
        if f"{key}_error" in results:
            lines.append(f"{label} of this host: error: {results[f'{key}_error']}")
        elif floor is not None:
            lines.append(
                f"{label} of this host ({what}): {floor:.2f} ms per token; at that floor a "
                f"2-stage decode would reach {100 * reference_ms / (reference_ms + floor):.1f}% "
                "of the reference")
    sessions = results["route_2_stages_sessions"]
    one, eight = sessions["1"]["best"], sessions["8"]["best"]
    lines.append(
        f"2-stage chain+loop (1+1 threads), aggregate decode: 1 session {one:.1f} tok/s, "
        f"8 sessions {eight:.1f} tok/s (best/best {eight / one:.2f}x, paired "
        f"{sessions['paired_ratio']:.2f}x)"
    )
    if "8_any_mix" in sessions:
        lines.append(
            f"  8 sessions with batch invariance off (--batching throughput): "
            f"{sessions['8_any_mix']['best']:.1f} tok/s; with it on, "
            f"x{sessions['paired_exact_vs_any_mix']:.3f} of that (paired)")
    if "8_alone" in sessions:
        lines.append(
            f"  8 sessions each stepping alone (--exact-batch-rows 1): "
            f"{sessions['8_alone']['best']:.1f} tok/s, x{sessions['paired_alone_vs_exact']:.3f}"
            " of the exact shared steps (paired)")
    for count in ("1", "8"):
        stages = sessions.get(f"stages_{count}") or []
        if stages:
            each = "; ".join(
                f"stage {i + 1} busy {100 * stage['busy_share']:.0f}%, "
                f"{stage['ms_per_token']:.2f} ms per token" for i, stage in enumerate(stages))
            lines.append(f"  {count} session(s), each stage's engine (median of rounds): {each}")
    if sessions.get("stages_8"):
        slowest = max(stage["ms_per_token"] for stage in sessions["stages_8"])
        if slowest > 0:
            bound = 1e3 / slowest
            lines.append(
                f"  bound with 8 sessions: the slower stage busy all the time, {bound:.1f} tok/s "
                f"({bound / sessions['1']['median']:.2f}x the median single session)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="Directory of meshnet-shard-worker (default: the built one).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None,
                        help="SmolLM2-135M GGUF file (default: the embedded one).")
    parser.add_argument("--gpu-layers", type=int, default=0,
                        help="Offload this many layers in every setup (GPU lanes; 999: all).")
    parser.add_argument("--repeats", type=int, default=5, help="Interleaved rounds.")
    parser.add_argument("--split", type=int, default=18,
                        help="First layer of the second stage (default 18 of 30).")
    parser.add_argument("--pin", action="store_true",
                        help="Bind every process measured to CPUs (see above).")
    parser.add_argument("--json", type=Path, default=None, help="Also write the raw results.")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=passive for every process measured.")
    parser.add_argument("--lane", choices=LANES, default="cpu",
                        help="A GPU lane: instead, every layer on the device, our kernel paths "
                             "against upstream's (vulkan: patch 0022), exact batching against "
                             "--batching throughput, the route against the unsplit model "
                             "(see lane_paths.py).")
    parser.add_argument("--tokens", type=int, default=8,
                        help="Decoded tokens a session with --lane vulkan (default 8: about "
                             "1 token/s on the software device).")
    options = parser.parse_args()
    if options.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    if not 0 < options.split < 30:
        parser.error("--split must be a layer boundary inside 1..29")
    if options.lane != "cpu":
        results = run_lane(lane_binary(options.lane, options.bin_dir), options.lane,
                           options.threads, options.repeats, options.split, options.tokens)
        print(lane_report(results))
    else:
        results = run(options.bin_dir, options.threads, options.repeats, options.model,
                      options.gpu_layers, options.split, options.pin)
        print(report(results))
    if options.json:
        options.json.write_text(json.dumps(results, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
