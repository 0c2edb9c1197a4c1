"""The data plane over a WAN: decode tokens/s of SmolLM2 routes of S stages when every
leg (driver to stage, stage to stage, the ring's back edge) goes through a user-space
proxy that models a network link, side by side with llama.cpp's RPC backend through the
same proxies, against the physical limit.

    .venv/bin/python bench/wan_bench.py [--stages 2,3,4] [--delays 0,5,10,25]
        [--profiles 'P;P'] [--tokens 32] [--rounds 3] [--windows 4] [--acceptance P,P]
        [--deepseek4 depth,width] [--ttft 1024,4096 [--ttft-only]]
        [--compression [--deepseek4 width] [--ttft 128]]

Legs: `--delays` gives each leg a one-way delay and nothing else; `--profiles` gives each
leg a modelled network instead (meshnet.devtools.link_model: delay, bandwidth, jitter,
loss), e.g. `--profiles 'same-rack;consumer;consumer:bw=50M,loss=0.5%'`.

Rows per (S, leg), all in one run (the proxies change their link in place):
  hub                 the driver calls each stage in turn            2S legs per token
  chain               the first stage relays, stepped by the driver  2S
  chain loop          the first stage decodes by itself              2(S-1)
  ring                the last stage hands each token to the first   S
  ring + speculation  the ring's loop drafting from prompt lookup at the first stage,
                      each draft verified by the last stage in the same pass, one
                      verify window at a time; on a repetitive (code) workload and on
                      free text
  ring + pipelined    the same with up to --windows verify windows in flight (the depth
                      reached is printed); its ratio to the serial row and to the ring
  llama.cpp RPC       ggml-rpc-server per stage, llama-bench -ngl 99
"Legs" is what the timings say: (ms per token - compute) / one-way delay, where compute
is the unsplit model's ms per token on one worker; "limit" is compute + S x (one-way +
a boundary row's bytes / bandwidth). Every worker runs 1 thread with the
local relay off, so no leg bypasses its proxy. The ring's rows run in --rounds
interleaved rounds (this machine is noisy) and print each row's median.

--acceptance 0.5,0.9 runs instead the ring's speculation with the benchmarks' drafter
(meshnet-shard-worker-bench, MESHNET_BENCH_ORACLE: it proposes a plain run's continuation,
each draft right with probability p; verification still decides every token), serial and
pipelined, beside the closed-form ceiling (meshnet.devtools.speculation_ceiling) at the
acceptance the drafter reached, over the same legs. L, the ring's latency of one verify
window on those legs, is measured at p = 1: every window commits all its rows and none is
rejected, so L holds no rejection's cost (a discard, wasted rows) and the ceiling is one.

--compression runs instead plain and packed links side by side (docs/protocol.md, "Boundary
compression"): two rings over the same legs, one of workers with --boundary-compression
shuffle-lz4 (MESHNET_TEST_COMPRESS_LOOPBACK=1: the proxies listen on 127.0.0.1), in
interleaved rounds, SmolLM2 or with --deepseek4 each tiny V4; per leg the decode tokens/s,
the first token's time after a prompt of --ttft tokens (the first length; 128 by default),
the packed route's ratio (raw / wire bytes its stages received) and whether it was on. Both
routes must give the same tokens. E.g. `--compression --deepseek4 width --stages 2
--profiles 'consumer;one-continent' --tokens 8 --rounds 2`.

--lane vulkan (e.g. `--lane vulkan --stages 2 --delays 0,10 --tokens 8 --spec-tokens 24
--rounds 2`) runs instead the ring plain and with serial and pipelined speculation on
code, every layer on the lane's device (`make vulkan`), on two routes: our kernel paths and
upstream's (MESHNET_VK_UPSTREAM_PATHS=1, patch 0022, same build), which speculates only as
far as its stages' probes found steps exact. On Mesa's software device (about 1 token/s
here) the figures compare setups inside one run only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median

from lane_paths import KERNELS, LANES, device_note, exactness, lane_binary, lane_gpu_layers

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.devtools import speculation_ceiling
from meshnet.devtools.bench_oracle import BENCH_WORKER, ORACLE_ENV, write_oracle
from meshnet.devtools.link_model import Link, parse_link
from meshnet.devtools.link_proxy import LinkProxy
from meshnet.devtools.tiny_deepseek4 import (
    HC_MULT,
    V4_DEPTH,
    V4_WIDTH,
    write_tiny_deepseek4,
)
from meshnet.local.process import LaunchSpec, WorkerProcess, free_port, start_route, worker_binary
from meshnet.paths import workspace
from meshnet.route import RouteDriver, StageClient
from meshnet.route.compression import TEST_LOOPBACK_SWITCH
from meshnet.route.route_key import RouteSecret

CODE = ("def parse_line(line):\n    fields = line.strip().split(',')\n    name = fields[0]\n"
        "    price = float(fields[1])\n    quantity = int(fields[2])\n"
        "    return name, price, quantity\n\n"
        "def total_price(items):\n    total = 0\n    for item in items:\n"
        "        total += item.price * item.quantity\n    return total\n")
# Code the model copies (acceptance ~0.88 on SmolLM2): the workload pipelining is for.
REPETITIVE = (f"# file a.py\n{CODE}\n# file b.py (an exact copy of a.py)\n{CODE}\n"
              "# file c.py (an exact copy of a.py)\n")
FREE_TEXT = "The history of printing begins"
SPECULATE = 6  # drafts per verification step, at most
SMOLLM2_ROW_BYTES = 576 * 4  # n_embd f32


@dataclass(frozen=True)
class Leg:
    """What every leg of a run is: a name for the tables and its link."""

    name: str
    link: Link

    @property
    def delay_ms(self) -> float:
        return self.link.delay_s * 1000


@dataclass
class Row:
    stages: int
    leg: Leg
    label: str
    rate: float  # decode tokens/s
    acceptance: float | None = None
    depth: int | None = None  # verify windows a pipelined loop kept in flight, at most
    compute_ms: float | None = None  # its model's unsplit ms per token (None: SmolLM2's)
    row_bytes: int = SMOLLM2_ROW_BYTES  # one boundary row on the wire
    copied: tuple[int, float] = (0, 0.0)  # Decoded's, each stretch's median rate
    rest: tuple[int, float] = (0, 0.0)


def spans(stages: int, layers: int) -> list[tuple[int, int]]:
    cuts = [round(i * layers / stages) for i in range(stages + 1)]
    return list(itertools.pairwise(cuts))


# Every route this bench starts holds it (the ring needs a route key); each driver proves it.
ROUTE_KEY = RouteSecret.generate()


@dataclass
class DelayedRoute:
    workers: list[WorkerProcess]
    proxies: list[LinkProxy]  # every leg's
    endpoints: list[str]  # what the driver calls: the driver-facing proxies

    def set_link(self, link: Link) -> None:
        for proxy in self.proxies:
            proxy.link = link


@contextmanager
def delayed_route(binary: Path, model: Path, stages: int, ring: bool, log_dir: Path,
                  layers: int = 30, discard_depth: int | None = None,
                  ctx: int = 1024, env: dict[str, str] | None = None,
                  gpu_layers: int = 0, extra: tuple[str, ...] = ()) -> Iterator[DelayedRoute]:
    """S chained stages, each leg through its own proxy. The proxies listen first and the
    workers bind ports the kernel picks, last stage first, each proxy aimed at its worker
    once that listens (no port is reserved ahead, so none can be taken meanwhile)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file = ROUTE_KEY.write(log_dir / "route.key")
    front = [LinkProxy() for _ in range(stages)]
    links = [LinkProxy() for _ in range(stages - 1)]  # stage i -> stage i + 1
    back = [LinkProxy()] if ring and stages > 1 else []
    workers: dict[int, WorkerProcess] = {}
    try:
        for index, span in reversed(list(enumerate(spans(stages, layers)))):
            spec = LaunchSpec(model=model, layers=LayerRange(*span), threads=1, local_relay=False,
                              pipeline_depth=stages, discard_depth=discard_depth, ctx=ctx,
                              gpu_layers=gpu_layers,
                              next_stage=links[index].endpoint if index < stages - 1 else "",
                              ring_last=back[0].endpoint if back and index == 0 else "",
                              route_key_file=key_file, extra=extra)
            worker = WorkerProcess(binary, spec, log_dir / f"worker-{index}.log", env).start()
            workers[index] = worker
            front[index].target_port = worker.port
            if index > 0:
                links[index - 1].target_port = worker.port
            if back and index == stages - 1:
                back[0].target_port = worker.port
        yield DelayedRoute([workers[i] for i in range(stages)], [*front, *links, *back],
                           [p.endpoint for p in front])
    finally:
        for worker in workers.values():
            worker.stop()
        for proxy in [*front, *links, *back]:
            proxy.stop()


@dataclass
class Decoded:
    rate: float  # decode tokens/s
    acceptance: float | None
    depth: int | None
    tokens: list[int]
    # the decode split where the output first stops copying its prompt (until then prompt
    # lookup drafts it whole): (tokens, tokens/s) of each stretch
    copied: tuple[int, float] = (0, 0.0)
    rest: tuple[int, float] = (0, 0.0)
    prompt_tokens: list[int] = field(default_factory=list)
    token_acceptance: float | None = None  # Generation.token_acceptance
    drafts: int = 0  # the most drafts a window carried (Generation.speculate)
    limit: str = ""  # why fewer than asked (Generation.speculation_limit)


def copied_from_prompt(prompt: list[int], output: list[int]) -> int:
    """How many of the output's first tokens follow on from somewhere in the prompt."""
    best = 0
    for start in range(len(prompt)):
        n = 0
        while n < len(output) and start + n < len(prompt) and prompt[start + n] == output[n]:
            n += 1
        best = max(best, n)
    return best


def stretch_rate(arrivals: list[float], first: int, last: int) -> float:
    """Tokens/s from token `first`'s arrival to token `last`'s."""
    seconds = arrivals[last] - arrivals[first]
    return (last - first) / seconds if seconds > 0 else 0.0


def decode(endpoints: list[str], prompt: str | list[int], tokens: int, topology: str,
           loop: bool = True, speculate: int = 0, windows: int = 1) -> Decoded:
    arrivals: list[float] = []
    with RouteDriver(endpoints, topology=topology, decode_loop=loop, speculate=speculate,
                     windows=windows, route_key=ROUTE_KEY) as driver:
        driver.connect(wait=30)
        driver.generate([1, 2, 3], max_tokens=2, stop_at_eos=False)  # warm the channels
        generation = driver.generate(prompt, max_tokens=tokens, stop_at_eos=False,
                                     on_token=lambda _: arrivals.append(time.monotonic()))
    n = len(arrivals)
    copied = min(copied_from_prompt(generation.prompt_tokens, generation.tokens), n)
    # the first token answers the prefill: the decode's stretches start after it
    split = max(1, copied)
    return Decoded(generation.decode_tokens_per_second,
                   generation.acceptance_rate if speculate else None,
                   generation.loop_depth if windows > 1 else None, generation.tokens,
                   (copied, stretch_rate(arrivals, 0, split - 1) if split > 1 else 0.0),
                   (n - split, stretch_rate(arrivals, split - 1, n - 1) if n > split else 0.0),
                   generation.prompt_tokens, generation.token_acceptance if speculate else None,
                   generation.speculate, generation.speculation_limit)


def llama_tool(name: str) -> Path:
    return workspace() / "llama-build" / "install" / "bin" / name


@contextmanager
def rpc_servers(stages: int) -> Iterator[tuple[list[LinkProxy], str]]:
    """One ggml-rpc-server (1 thread) per stage, each behind a proxy."""
    proxies = [LinkProxy() for _ in range(stages)]  # listening first: free_port skips them
    ports = [free_port() for _ in range(stages)]
    servers = [subprocess.Popen([str(llama_tool("ggml-rpc-server")), "-H", "127.0.0.1",
                                 "-p", str(port), "-t", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for port in ports]
    for proxy, port in zip(proxies, ports, strict=True):
        proxy.target_port = port
    time.sleep(1.0)
    try:
        yield proxies, ",".join(p.endpoint for p in proxies)
    finally:
        for proxy in proxies:
            proxy.stop()
        for server in servers:
            server.terminate()
            server.wait(10)


def rpc_decode(model: Path, endpoints: str, tokens: int) -> float:
    done = subprocess.run(
        [str(llama_tool("llama-bench")), "-m", str(model), "--rpc", endpoints, "-ngl", "99",
         "-t", "1", "-p", "0", "-n", str(tokens), "-r", "1", "-o", "json"],
        capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-600:]}")
    return float(json.loads(done.stdout)[0]["avg_ts"])


def unsplit_ms(binary: Path, model: Path, tokens: int, log_dir: Path, layers: int = 30,
               prompt: str = FREE_TEXT) -> float:
    """The compute of one token: the whole model on one worker, no network."""
    log_dir.mkdir(parents=True, exist_ok=True)
    (worker,) = start_route(binary, [LaunchSpec(model=model, layers=LayerRange(0, layers),
                                                threads=1)], log_dir)
    try:
        rate = decode([worker.endpoint], prompt, tokens, "hub").rate
    finally:
        worker.stop()
    return 1000.0 / rate


def measure(binary: Path, model: Path, stages: int, legs: list[Leg], tokens: int,
            spec_tokens: int, rpc: bool, log_dir: Path, rounds: int, windows: int) -> list[Row]:
    rows: list[Row] = []

    def add(leg: Leg, label: str, result: Decoded) -> None:
        rows.append(Row(stages, leg, label, result.rate, result.acceptance, result.depth))
        depth = f" depth {result.depth}" if result.depth is not None else ""
        print(f"  S={stages} {leg.name:>14}  {label:<30} {result.rate:7.1f} tok/s{depth}",
              flush=True)

    with delayed_route(binary, model, stages, False, log_dir / f"chain{stages}") as route:
        for leg in legs:
            route.set_link(leg.link)
            add(leg, "hub", decode(route.endpoints, FREE_TEXT, tokens, "hub", loop=False))
            add(leg, "chain", decode(route.endpoints, FREE_TEXT, tokens, "chain", loop=False))
            add(leg, "chain loop", decode(route.endpoints, FREE_TEXT, tokens, "chain"))
    with delayed_route(binary, model, stages, True, log_dir / f"ring{stages}") as route:
        for leg in legs:
            route.set_link(leg.link)
            rows += ring_rows(route.endpoints, stages, leg, tokens, spec_tokens, rounds,
                              windows)
    if rpc:
        with rpc_servers(stages) as (proxies, endpoints):
            for leg in legs:
                for proxy in proxies:
                    proxy.link = leg.link
                add(leg, "llama.cpp RPC", Decoded(rpc_decode(model, endpoints, tokens),
                                                  None, None, []))
    return rows


def ring_rows(endpoints: list[str], stages: int, leg: Leg, tokens: int, spec_tokens: int,
              rounds: int, windows: int, free_text: str | list[int] = FREE_TEXT,
              code: str | list[int] | None = REPETITIVE, label: str = "") -> list[Row]:
    """The ring plain, with serial and with pipelined speculation, in interleaved rounds:
    each row's median. Every speculating row must give the plain row's tokens."""
    setups: dict[str, tuple[str | list[int], int, int, int]] = {
        "ring": (free_text, tokens, 0, 1),
        "ring + speculation, code": (code or free_text, spec_tokens, SPECULATE, 1),
        "ring + pipelined, code": (code or free_text, spec_tokens, SPECULATE, windows),
        "ring + speculation, free text": (free_text, spec_tokens, SPECULATE, 1),
        "ring + pipelined, free text": (free_text, spec_tokens, SPECULATE, windows),
    }
    if code is None:  # no workload the model copies
        setups = {name: setup for name, setup in setups.items() if "code" not in name}
    runs: dict[str, list[Decoded]] = {name: [] for name in setups}
    plain = {prompt_key(p): decode(endpoints, p, spec_tokens, "ring").tokens
             for p in {prompt_key(s[0]): s[0] for s in setups.values()}.values()}
    for _ in range(rounds):
        for name, (prompt, count, speculate, depth) in setups.items():
            result = decode(endpoints, prompt, count, "ring", speculate=speculate,
                            windows=depth)
            if speculate and result.tokens != plain[prompt_key(prompt)]:
                raise SystemExit(f"{name}: the tokens differ from plain decoding")
            runs[name].append(result)
            depth_note = f" depth {result.depth}" if result.depth is not None else ""
            print(f"  S={stages} {leg.name:>14}  {label}{name:<30} {result.rate:7.1f} tok/s"
                  f"{depth_note}", flush=True)
    rows = []
    for name, results in runs.items():
        middle = sorted(results, key=lambda r: r.rate)[len(results) // 2]
        depths = [r.depth for r in results if r.depth is not None]
        rows.append(Row(stages, leg, label + name, middle.rate, middle.acceptance,
                        max(depths) if depths else None,
                        copied=(middle.copied[0], median([r.copied[1] for r in results])),
                        rest=(middle.rest[0], median([r.rest[1] for r in results]))))
    return rows


@dataclass(frozen=True)
class LaneRow:
    """One setup of the ring over one leg on a GPU lane, per kernel paths: each run."""

    stages: int
    leg: Leg
    label: str
    runs: dict[str, list[Decoded]]  # kernel paths (lane_paths.KERNELS) -> one per round


def lane_rows(binary: Path, lane: str, stages: int, legs: list[Leg], tokens: int,
              spec_tokens: int, rounds: int, windows: int, log_dir: Path) -> list[LaneRow]:
    """On a GPU lane, every layer on the device: the ring plain (free text) and speculating
    on code (serial and pipelined), on our kernel paths and on upstream's (patch 0022), two
    routes over the same legs, in interleaved rounds that alternate which route runs first.
    Every speculating run must give its own route's plain tokens; a route speculates only
    as far as its stages' start-up probes measured steps exact (the drafts used and the
    reason are printed)."""
    model = smollm2_gguf()
    setups: dict[str, tuple[str, int, int, int]] = {
        "ring": (FREE_TEXT, tokens, 0, 1),
        "ring + speculation, code": (REPETITIVE, spec_tokens, SPECULATE, 1),
        "ring + pipelined, code": (REPETITIVE, spec_tokens, SPECULATE, windows),
    }
    rows: list[LaneRow] = []
    with ExitStack() as stack:
        routes = {kernels: stack.enter_context(delayed_route(
                      binary, model, stages, True, log_dir / f"{lane}-{kernels}-ring{stages}",
                      discard_depth=windows * (SPECULATE + 1) - 1, env=env,
                      gpu_layers=lane_gpu_layers(lane)))
                  for kernels, env in KERNELS.items()}
        for kernels, route in routes.items():
            with RouteDriver(route.endpoints, topology="ring", route_key=ROUTE_KEY) as driver:
                print(f"  S={stages} {kernels}: {exactness(driver.connect(wait=60).stages)}",
                      flush=True)
        for leg in legs:
            for route in routes.values():
                route.set_link(leg.link)
            plain = {kernels: decode(route.endpoints, REPETITIVE, spec_tokens, "ring").tokens
                     for kernels, route in routes.items()}
            runs: dict[str, dict[str, list[Decoded]]] = {name: {} for name in setups}
            for round_index in range(rounds):
                order = list(routes) if round_index % 2 == 0 else list(reversed(routes))
                for name, (prompt, count, drafts, depth) in setups.items():
                    for kernels in order:
                        result = decode(routes[kernels].endpoints, prompt, count, "ring",
                                        speculate=drafts, windows=depth)
                        if drafts and result.tokens != plain[kernels]:
                            raise SystemExit(f"{kernels}, {name}: the tokens differ from "
                                             "plain decoding")
                        runs[name].setdefault(kernels, []).append(result)
                        limit = f", {result.drafts} drafts ({result.limit or 'as asked'})" \
                            if drafts else ""
                        print(f"  S={stages} {leg.name:>14}  {kernels:<15} {name:<26} "
                              f"{result.rate:7.2f} tok/s{limit}", flush=True)
            rows += [LaneRow(stages, leg, name, by_kernels) for name, by_kernels in runs.items()]
    return rows


def lane_report(rows: list[LaneRow], note: str) -> None:
    """Each setup's median on our paths and on upstream's, and ours over theirs paired
    round by round (the median of the rounds' ratios)."""
    exact, upstream = KERNELS
    print(f"\n{note}")
    print(f"{'S':>2} {'leg':>14} {'row':<26} {'exact tok/s':>11} {'upstream':>9} "
          f"{'paired':>7}  upstream's speculation")
    for row in rows:
        ours, theirs = row.runs[exact], row.runs[upstream]
        paired = median(a.rate / b.rate for a, b in zip(ours, theirs, strict=True) if b.rate)
        asked = "ring +" in row.label
        drafts = f"{theirs[0].drafts} drafts ({theirs[0].limit or 'as asked'})" if asked else ""
        print(f"{row.stages:>2} {row.leg.name:>14} {row.label:<26} "
              f"{median(r.rate for r in ours):11.2f} {median(r.rate for r in theirs):9.2f} "
              f"x{paired:6.3f}  {drafts}")


V4_SHAPES = {"depth": V4_DEPTH, "width": V4_WIDTH}


def deepseek4_rows(binary: Path, stages: int, legs: list[Leg], tokens: int, rounds: int,
                   windows: int, log_dir: Path, kind: str) -> list[Row]:
    """The ring's rows on a tiny random-weight V4 over the same legs, its stages keeping
    rollback snapshots for the drafts and windows in flight: `depth` has V4-Flash's 43
    layers (mHC boundary, hash-routed layers) at width 64, `width` V4's real boundary
    (n_embd 4096 x mHC 4, 64 KiB a row) on 4 small layers, what bandwidth sees. Random
    weights repeat little of what they are shown, so prompt lookup seldom drafts what they
    say: the rows show the ring's cost and that speculation costs nothing where it cannot
    help, not what V4 itself would accept."""
    shape = V4_SHAPES[kind]
    model = write_tiny_deepseek4(log_dir / f"tiny-v4-{kind}.gguf", shape, seed=3)
    prompt = "the map of the world and the story of the sea coast line chart. " * 4
    compute_ms = unsplit_ms(binary, model, tokens, log_dir / f"ds4-{kind}-unsplit",
                            shape.n_layer, prompt)
    print(f"tiny V4 ({kind}) compute (unsplit, 1 thread): {compute_ms:.1f} ms/token",
          flush=True)
    rows: list[Row] = []
    with delayed_route(binary, model, stages, True, log_dir / f"ds4-{kind}-ring{stages}",
                       layers=shape.n_layer,
                       discard_depth=windows * (SPECULATE + 1) - 1) as route:
        for leg in legs:
            route.set_link(leg.link)
            rows += ring_rows(route.endpoints, stages, leg, tokens, tokens, rounds, windows,
                              free_text=prompt, code=None, label=f"V4 {kind} ")
    row_bytes = HC_MULT * shape.n_embd * 4  # the mHC streams, f32
    return [replace(row, compute_ms=compute_ms, row_bytes=row_bytes) for row in rows]


@dataclass(frozen=True)
class Ttft:
    stages: int
    leg: Leg
    model: str
    prompt_tokens: int
    seconds: float  # the first token's time: the prefill (median of the rounds)
    compute_s: float  # the slowest stage's share of the unsplit prefill
    row_bytes: int
    wavefront: bool  # the prefill's chunks were pipelined through the stages

    @property
    def wire_s(self) -> float:
        """Every prompt row through the slowest leg: bytes over its bandwidth."""
        return self.leg.link.serialise_s(self.prompt_tokens * self.row_bytes)

    @property
    def bound_s(self) -> float:
        """The floor of a pipelined prefill: the slower of the slowest stage's compute and
        the slowest leg's wire time, once the S legs' delays are paid."""
        return max(self.compute_s, self.wire_s) + self.stages * self.leg.link.delay_s


def first_token(endpoints: list[str], prompt: list[int],
                topology: str = "ring") -> tuple[float, bool]:
    """(seconds to the first token, whether the prefill went as a wavefront)."""
    with RouteDriver(endpoints, topology=topology, route_key=ROUTE_KEY) as driver:
        driver.connect(wait=60)
        driver.generate([1, 2, 3], max_tokens=1, stop_at_eos=False)  # warm the channels
        generation = driver.generate(prompt, max_tokens=1, stop_at_eos=False)
    return generation.prefill_seconds, generation.prefill_wavefront


def long_prompt(endpoint: str, n_tokens: int) -> list[int]:
    """`n_tokens` of text (the code sample repeated), tokenized by the route itself."""
    with RouteDriver([endpoint]) as driver:
        driver.connect(wait=60)
        base = driver.tokenize(CODE)
    return (base * (n_tokens // len(base) + 1))[:n_tokens]


def ttft_rows(binary: Path, model: Path, name: str, stages: int, legs: list[Leg],
              lengths: list[int], rounds: int, log_dir: Path, layers: int,
              row_bytes: int) -> list[Ttft]:
    """The first token's time after prompts of each length, per leg, in interleaved
    rounds, beside the unsplit model's prefill of the same prompt (1 thread)."""
    ctx = max(lengths) + 64
    (log_dir / f"{name}-whole").mkdir(parents=True, exist_ok=True)
    (whole,) = start_route(binary, [LaunchSpec(model=model, layers=LayerRange(0, layers),
                                               threads=1, ctx=ctx)], log_dir / f"{name}-whole")
    try:
        prompts = {n: long_prompt(whole.endpoint, n) for n in lengths}
        unsplit = {n: first_token([whole.endpoint], prompts[n], "hub")[0] for n in lengths}
    finally:
        whole.stop()
    share = max(end - begin for begin, end in spans(stages, layers)) / layers
    seen: dict[tuple[Leg, int], list[tuple[float, bool]]] = {}
    with delayed_route(binary, model, stages, True, log_dir / f"{name}-ttft{stages}",
                       layers=layers, ctx=ctx) as route:
        for _ in range(rounds):
            for leg in legs:
                route.set_link(leg.link)
                for n in lengths:
                    seen.setdefault((leg, n), []).append(first_token(route.endpoints,
                                                                     prompts[n]))
                    print(f"  S={stages} {leg.name:>14}  {name} TTFT {n} tokens "
                          f"{seen[leg, n][-1][0]:.2f} s", flush=True)
    return [Ttft(stages, leg, name, n, median(s for s, _ in runs), unsplit[n] * share,
                 row_bytes, all(w for _, w in runs)) for (leg, n), runs in seen.items()]


def ttft_report(rows: list[Ttft]) -> None:
    print("\nTTFT; bound = max(slowest stage's share of the unsplit prefill, prompt bytes /"
          " bandwidth) + S x one-way")
    print(f"{'S':>2} {'leg':>14} {'model':<10} {'prompt':>6} {'TTFT s':>7} {'compute':>7} "
          f"{'wire':>7} {'bound':>7} {'of bound':>8} wavefront")
    for row in rows:
        print(f"{row.stages:>2} {row.leg.name:>14} {row.model:<10} {row.prompt_tokens:>6} "
              f"{row.seconds:7.2f} {row.compute_s:7.2f} {row.wire_s:7.2f} {row.bound_s:7.2f} "
              f"{100 * row.bound_s / row.seconds:7.0f}% {'yes' if row.wavefront else 'no'}")


COMPRESSION_ENV = {TEST_LOOPBACK_SWITCH: "1"}  # the proxies are on loopback
ENCODED = re.compile(r'^meshnet_shard_boundary_encoded_bytes_total\{direction="in",'
                     r'encoding="shuffle_lz4",kind="(raw|wire)"\} (\d+)$', re.M)


def packed_bytes(workers: list[WorkerProcess]) -> tuple[int, int]:
    """(raw, wire) boundary bytes the stages took in packed (their metrics)."""
    raw = wire = 0
    for worker in workers[1:]:
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            counts = dict(ENCODED.findall(response.read().decode()))
        raw, wire = raw + int(counts.get("raw", 0)), wire + int(counts.get("wire", 0))
    return raw, wire


@dataclass(frozen=True)
class CompressionRow:
    stages: int
    leg: Leg
    model: str
    compression: str  # the workers' --boundary-compression
    rate: float  # decode tokens/s (the ring, median of the rounds)
    ttft_s: float  # the first token after the prompt (median)
    prompt_tokens: int
    raw_bytes: int  # boundary bytes the stages took in packed, raw and on the wire
    wire_bytes: int


def compression_rows(binary: Path, model: Path, name: str, stages: int, legs: list[Leg],
                     tokens: int, prompt_tokens: int, rounds: int, log_dir: Path,
                     layers: int) -> list[CompressionRow]:
    """A plain and a packed ring over the same legs in interleaved rounds (alternating
    which runs first): decode tokens/s and the first token's time after `prompt_tokens`.
    Both must give the same tokens."""
    settings = {"off": (), "shuffle-lz4": ("--boundary-compression", "shuffle-lz4")}
    seen: dict[tuple[Leg, str], list[tuple[float, float]]] = {}
    counts: dict[tuple[Leg, str], tuple[int, int]] = {}
    outputs: dict[Leg, set[tuple[int, ...]]] = {}  # every run's tokens: one set per leg
    with ExitStack() as stack:
        routes = {setting: stack.enter_context(delayed_route(
                      binary, model, stages, True, log_dir / f"{name}-{setting}-ring{stages}",
                      layers=layers, ctx=prompt_tokens + tokens + 64, env=COMPRESSION_ENV,
                      extra=extra))
                  for setting, extra in settings.items()}
        base = StageClient(routes["off"].workers[0].endpoint).tokenize(
            "the map of the world and the story of the sea coast line chart. ")
        prompt = (base * (prompt_tokens // len(base) + 1))[:prompt_tokens]
        for number in range(rounds):
            for leg in legs:
                order = list(routes.items())
                for setting, route in order if number % 2 == 0 else order[::-1]:
                    route.set_link(leg.link)
                    before = packed_bytes(route.workers)
                    result = decode(route.endpoints, prompt, tokens, "ring")
                    ttft, _ = first_token(route.endpoints, prompt)
                    after = packed_bytes(route.workers)
                    done = counts.get((leg, setting), (0, 0))
                    counts[leg, setting] = (done[0] + after[0] - before[0],
                                            done[1] + after[1] - before[1])
                    seen.setdefault((leg, setting), []).append((result.rate, ttft))
                    outputs.setdefault(leg, set()).add(tuple(result.tokens))
                    if len(outputs[leg]) > 1:
                        raise SystemExit(f"{name} {leg.name}: packed links changed the tokens")
                    print(f"  S={stages} {leg.name:>14}  {name} {setting:<12} "
                          f"{result.rate:7.1f} tok/s  TTFT {ttft:.2f} s", flush=True)
    return [CompressionRow(stages, leg, name, setting, median(r for r, _ in runs),
                           median(t for _, t in runs), prompt_tokens, *counts[leg, setting])
            for (leg, setting), runs in seen.items()]


def compression_report(rows: list[CompressionRow]) -> None:
    print("\nPlain and packed links (--boundary-compression); ratio = raw / wire bytes the "
          "packed route's stages took in")
    print(f"{'S':>2} {'leg':>14} {'model':<10} {'links':<12} {'tok/s':>7} {'TTFT s':>7} "
          f"{'prompt':>6} {'ratio':>6} on")
    for row in rows:
        ratio = f"{row.raw_bytes / row.wire_bytes:6.3f}" if row.wire_bytes else "     -"
        print(f"{row.stages:>2} {row.leg.name:>14} {row.model:<10} {row.compression:<12} "
              f"{row.rate:7.1f} {row.ttft_s:7.2f} {row.prompt_tokens:>6} {ratio} "
              f"{'yes' if row.wire_bytes else 'no'}")


def prompt_key(prompt: str | list[int]) -> str:
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))


def stretches(rows: list[Row], stages: int, leg: Leg, label: str) -> str:
    """Pipelined over serial speculation on each stretch of the code row's output: while
    it copies its prompt without a break (lookup drafts it whole), and after its first
    token of its own (such tokens cost both a ring round trip each, and every rejection
    drops the windows in flight: that stretch bounds the whole)."""
    row = {(r.stages, r.leg, r.label): r for r in rows}
    pipelined = row[(stages, leg, label)]
    serial = row[(stages, leg, label.replace("pipelined", "speculation"))]
    parts = []
    for name, mine, theirs in (("copied", pipelined.copied, serial.copied),
                               ("after", pipelined.rest, serial.rest)):
        ratio = f"x{mine[1] / theirs[1]:.2f}" if theirs[1] > 0 else "-"
        parts.append(f"{name} {mine[0]} tokens: {mine[1]:.1f} tok/s pipelined, "
                     f"{theirs[1]:.1f} serial ({ratio})")
    return f"    by stretch: {'; '.join(parts)}"


def limit_ms(row: Row, compute_ms: float) -> float:
    """The physical floor of a decoded token: compute, then S legs each paying its one-way
    delay and a boundary row's time on the wire."""
    return compute_ms + row.stages * (row.leg.link.delay_s
                                      + row.leg.link.serialise_s(row.row_bytes)) * 1000


def report(rows: list[Row], compute_ms: float) -> None:
    print(f"\ncompute (unsplit, 1 thread): {compute_ms:.1f} ms/token; limit = compute + "
          "S x (one-way + row bytes / bandwidth)")
    for leg in dict.fromkeys(row.leg for row in rows):
        print(f"  {leg.name}: {leg.link.describe()}")
    print(f"{'S':>2} {'leg':>14} {'row':<30} {'tok/s':>7} {'ms/tok':>7} {'legs':>5} "
          f"{'limit':>7} {'of limit':>9} {'accept':>7} {'depth':>5}")
    for row in rows:
        ms = 1000.0 / row.rate
        compute = row.compute_ms or compute_ms
        delay_ms = row.leg.delay_ms
        legs = f"{(ms - compute) / delay_ms:5.1f}" if delay_ms else "    -"
        limit = 1000.0 / limit_ms(row, compute)
        accept = f"{row.acceptance:7.2f}" if row.acceptance is not None else "       "
        depth = f"{row.depth:5d}" if row.depth is not None else "     "
        print(f"{row.stages:>2} {row.leg.name:>14} {row.label:<30} {row.rate:7.1f} {ms:7.1f} "
              f"{legs} {limit:7.1f} {100 * row.rate / limit:8.1f}% {accept} {depth}")
    by = {(r.stages, r.leg, r.label): r.rate for r in rows}
    print()
    for (stages, leg, label), rate in by.items():
        rpc = by.get((stages, leg, "llama.cpp RPC"))
        if label == "ring" and rpc:
            print(f"S={stages} {leg.name}: ring x{rate / rpc:.2f} llama.cpp RPC")
        if label.endswith("ring + pipelined, code"):
            serial = by[(stages, leg, label.replace("pipelined", "speculation"))]
            print(f"S={stages} {leg.name}: {label} x{rate / serial:.2f} serial speculation")
            print(stretches(rows, stages, leg, label))
        if label.endswith("ring + pipelined, free text"):
            ring = by[(stages, leg, label.replace("ring + pipelined, free text", "ring"))]
            print(f"S={stages} {leg.name}: {label} x{rate / ring:.2f} the plain ring")


@dataclass
class OracleRow:
    """The ring's speculation at one acceptance of the benchmarks' drafter."""

    stages: int
    leg: Leg
    p: float  # the drafter's set acceptance
    held: float  # the measured one (Generation.token_acceptance, median)
    latency_s: float  # L: one verify window round the ring (measured at p = 1)
    plain: float  # the ring without speculation, tok/s
    serial: float  # one verify window in flight, tok/s (median)
    pipelined: float  # up to --windows in flight, tok/s (median)
    depth: int  # windows the pipelined loop kept in flight, at most


def window_seconds(result: Decoded, drafts: int) -> float:
    """A serial run's time per verify window at p = 1: every window commits its drafts + 1
    tokens but the last, which may be shorter (and, of one row, is no speculative step)."""
    windows = math.ceil((len(result.tokens) - 1) / (drafts + 1))
    return (len(result.tokens) - 1) / result.rate / windows


def oracle_rows(binary: Path, model: Path, stages: int, legs: list[Leg], tokens: int,
                rounds: int, windows: int, drafts: int, acceptances: list[float],
                log_dir: Path) -> list[OracleRow]:
    """Per leg: a plain run gives the continuation the drafter proposes; then, in
    interleaved rounds, p = 1 (L) and each acceptance serial and pipelined, each run's
    tokens checked against the plain run's."""
    oracle = log_dir / f"oracle-{stages}.txt"
    write_oracle(oracle, 0.0, [1])  # a loop reads it as it starts: valid from the first
    rows: list[OracleRow] = []
    with delayed_route(binary, model, stages, True, log_dir / f"oracle-ring{stages}",
                       env={ORACLE_ENV: str(oracle)}) as route:
        for leg in legs:
            route.set_link(leg.link)
            plain = decode(route.endpoints, FREE_TEXT, tokens, "ring")
            sequence = [*plain.prompt_tokens, *plain.tokens]
            setups = [(1.0, 1), *((p, depth) for p in acceptances for depth in (1, windows))]
            runs: dict[tuple[float, int], list[Decoded]] = {setup: [] for setup in setups}
            for _ in range(rounds):
                for p, depth in setups:
                    write_oracle(oracle, p, sequence)
                    result = decode(route.endpoints, FREE_TEXT, tokens, "ring",
                                    speculate=drafts, windows=depth)
                    if result.tokens != plain.tokens:
                        raise SystemExit(f"p={p} windows={depth}: the tokens differ from "
                                         "plain decoding")
                    runs[(p, depth)].append(result)
                    mode = "serial" if depth == 1 else f"pipelined, depth {result.depth}"
                    print(f"  S={stages} {leg.name:>14}  oracle p={p:<4g} {mode:<20} "
                          f"{result.rate:7.1f} tok/s, held {result.token_acceptance:.2f}",
                          flush=True)
            latency_s = median(window_seconds(r, drafts) for r in runs[(1.0, 1)])
            for p in acceptances:
                serial, piped = runs[(p, 1)], runs[(p, windows)]
                rows.append(OracleRow(
                    stages, leg, p, median(r.token_acceptance or 0.0 for r in serial + piped),
                    latency_s, plain.rate, median(r.rate for r in serial),
                    median(r.rate for r in piped), max(r.depth or 1 for r in piped)))
    return rows


def oracle_report(rows: list[OracleRow], drafts: int, windows: int) -> None:
    """Each row beside its ceiling at the acceptance the drafter reached (`held`: a run's
    few hundred coins stray from p): serial against the peer's E / L, E = (1 - p^(k+1)) /
    (1 - p); pipelined against the loop's form with up to D windows in flight."""
    print(f"\nceilings at the acceptance held (k = {drafts} drafts a window, D = up to "
          f"{windows} windows): serial E / L, pipelined E_D / L "
          "(meshnet.devtools.speculation_ceiling)")
    for leg in dict.fromkeys(row.leg for row in rows):
        print(f"  {leg.name}: {leg.link.describe()}")
    print(f"{'S':>2} {'leg':>14} {'p':>5} {'held':>5} {'L ms':>6} {'plain':>6} "
          f"{'serial':>7} {'ceiling':>7} {'of it':>6} {'piped':>7} {'depth':>5} "
          f"{'ceiling':>7} {'of it':>6}")
    for row in rows:
        serial = speculation_ceiling.serial(row.held, drafts).rate(row.latency_s)
        piped = speculation_ceiling.pipelined(row.held, drafts, windows).rate(row.latency_s)
        print(f"{row.stages:>2} {row.leg.name:>14} {row.p:5.2f} {row.held:5.2f} "
              f"{row.latency_s * 1000:6.1f} {row.plain:6.1f} {row.serial:7.1f} {serial:7.1f} "
              f"{100 * row.serial / serial:5.1f}% {row.pipelined:7.1f} {row.depth:5d} "
              f"{piped:7.1f} {100 * row.pipelined / piped:5.1f}%")


def legs_of(delays: str, profiles: str | None) -> list[Leg]:
    if profiles:
        return [Leg(text, parse_link(text)) for text in profiles.split(";")]
    return [Leg(f"{float(d):g} ms", Link(float(d) / 1000)) for d in delays.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="2,3,4", help="Stage counts, comma separated.")
    parser.add_argument("--delays", default="0,5,10,25", help="One-way ms per leg.")
    parser.add_argument("--profiles", default=None,
                        help="Link profiles instead of bare delays, ';' separated, each a "
                             "name with optional overrides (same-rack, one-region, "
                             "one-continent, consumer; e.g. 'consumer;consumer:bw=50M').")
    parser.add_argument("--tokens", type=int, default=32, help="Decoded tokens per row.")
    parser.add_argument("--spec-tokens", type=int, default=128,
                        help="Decoded tokens of the speculation rows (drafting adapts as it "
                             "goes: short runs show mostly its start).")
    parser.add_argument("--no-rpc", action="store_true", help="Leave llama.cpp RPC out.")
    parser.add_argument("--rounds", type=int, default=3,
                        help="Interleaved rounds of the ring's rows (each row's median).")
    parser.add_argument("--windows", type=int, default=4,
                        help="Verify windows the pipelined rows keep in flight at most.")
    parser.add_argument("--deepseek4", default="", metavar="depth,width",
                        help="Also the ring's rows on tiny random-weight V4s: depth (43 "
                             "layers, width 64), width (V4's 64 KiB boundary row, 4 layers).")
    parser.add_argument("--ttft", default="", metavar="N,N",
                        help="Also the first token's time after prompts of these lengths "
                             "(e.g. 1024,4096), per stage count and leg, on SmolLM2 and on "
                             "each --deepseek4 model; only these rows with --ttft-only.")
    parser.add_argument("--compression", action="store_true",
                        help="Plain and packed links side by side (--boundary-compression "
                             "shuffle-lz4): the ring's decode and first token, per leg.")
    parser.add_argument("--ttft-only", action="store_true",
                        help="Measure only the --ttft rows.")
    parser.add_argument("--acceptance", default="", metavar="P,P",
                        help="Instead: the ring's speculation with the benchmarks' drafter at "
                             "each per-token acceptance (0..1), serial and pipelined, against "
                             "the closed-form ceiling (--spec-tokens tokens a run).")
    parser.add_argument("--drafts", type=int, default=SPECULATE,
                        help="Drafts per verify window of the --acceptance rows.")
    parser.add_argument("--bin-dir", type=Path, default=None)
    parser.add_argument("--lane", choices=LANES, default="cpu",
                        help="vulkan: instead, the ring plain and speculating on code, every "
                             "layer on the device, on our kernel paths and on upstream's "
                             "(patch 0022); no llama.cpp RPC. Keep runs short there.")
    options = parser.parse_args()
    name = BENCH_WORKER if options.acceptance else "meshnet-shard-worker"
    binary = options.bin_dir / name if options.bin_dir else worker_binary(name=name)
    model = smollm2_gguf()
    try:
        legs = legs_of(options.delays, options.profiles)
    except ValueError as error:
        parser.error(str(error))
    if unknown := set(filter(None, options.deepseek4.split(","))) - set(V4_SHAPES):
        parser.error(f"--deepseek4: unknown {', '.join(sorted(unknown))} (depth, width)")
    try:
        lengths = [int(n) for n in filter(None, options.ttft.split(","))]
    except ValueError:
        parser.error("--ttft: prompt lengths in tokens, comma separated (e.g. 1024,4096)")
    if options.ttft_only and not lengths:
        parser.error("--ttft-only needs --ttft")
    try:
        acceptances = [float(p) for p in filter(None, options.acceptance.split(","))]
    except ValueError:
        parser.error(f"--acceptance: numbers from 0 to 1, not {options.acceptance!r}")
    if any(not 0 <= p <= 1 for p in acceptances) or options.drafts < 1:
        parser.error("--acceptance takes numbers from 0 to 1, --drafts at least 1")
    log_dir = Path(tempfile.mkdtemp(prefix="meshnet-wan-"))
    if options.compression:
        print(f"{options.tokens} tokens a decode, load average {os.getloadavg()[0]:.2f}, "
              f"logs in {log_dir}", flush=True)
        prompt_tokens = lengths[0] if lengths else 128
        packing: list[CompressionRow] = []
        for stages in (int(s) for s in options.stages.split(",")):
            if not options.deepseek4:
                packing += compression_rows(binary, model, "SmolLM2", stages, legs,
                                            options.tokens, prompt_tokens, options.rounds,
                                            log_dir, 30)
            for kind in filter(None, options.deepseek4.split(",")):
                shape = V4_SHAPES[kind]
                v4 = write_tiny_deepseek4(log_dir / f"tiny-v4-{kind}.gguf", shape, seed=3)
                packing += compression_rows(binary, v4, f"V4 {kind}", stages, legs,
                                            options.tokens, prompt_tokens, options.rounds,
                                            log_dir, shape.n_layer)
        compression_report(packing)
        return
    if options.lane != "cpu":
        if acceptances or lengths or options.deepseek4:
            parser.error("--lane vulkan measures the ring's rows only (no --acceptance, --ttft "
                         "or --deepseek4)")
        note = device_note(options.lane)
        print(f"{note}\nSmolLM2-135M Q4_1, {options.tokens} tokens a plain row, "
              f"{options.spec_tokens} a speculating one, load average "
              f"{os.getloadavg()[0]:.2f}, logs in {log_dir}", flush=True)
        lane: list[LaneRow] = []
        for stages in (int(s) for s in options.stages.split(",")):
            lane += lane_rows(lane_binary(options.lane, options.bin_dir), options.lane, stages,
                              legs, options.tokens, options.spec_tokens, options.rounds,
                              options.windows, log_dir)
        lane_report(lane, note)
        return
    if acceptances:
        print(f"SmolLM2-135M Q4_1, {options.spec_tokens} tokens a run, {options.drafts} drafts "
              f"a window, load average {os.getloadavg()[0]:.2f}, logs in {log_dir}")
        oracle: list[OracleRow] = []
        for stages in (int(s) for s in options.stages.split(",")):
            oracle += oracle_rows(binary, model, stages, legs, options.spec_tokens,
                                  options.rounds, options.windows, options.drafts,
                                  acceptances, log_dir)
        oracle_report(oracle, options.drafts, options.windows)
        return
    print(f"SmolLM2-135M Q4_1, {options.tokens} tokens per row ({options.spec_tokens} with "
          f"speculation), load average "
          f"{os.getloadavg()[0]:.2f}, logs in {log_dir}")
    stage_counts = [int(s) for s in options.stages.split(",")]
    kinds = list(filter(None, options.deepseek4.split(",")))
    if not options.ttft_only:
        compute_ms = unsplit_ms(binary, model, options.tokens, log_dir / "unsplit")
        rows: list[Row] = []
        for stages in stage_counts:
            rows += measure(binary, model, stages, legs, options.tokens, options.spec_tokens,
                            not options.no_rpc, log_dir, options.rounds, options.windows)
            for kind in kinds:
                rows += deepseek4_rows(binary, stages, legs, options.tokens, options.rounds,
                                       options.windows, log_dir, kind)
        report(rows, compute_ms)
    if lengths:
        ttfts: list[Ttft] = []
        for stages in stage_counts:
            ttfts += ttft_rows(binary, model, "SmolLM2", stages, legs, lengths, options.rounds,
                               log_dir, 30, SMOLLM2_ROW_BYTES)
            for kind in kinds:
                shape = V4_SHAPES[kind]
                v4 = write_tiny_deepseek4(log_dir / f"tiny-v4-{kind}.gguf", shape, seed=3)
                ttfts += ttft_rows(binary, v4, f"V4 {kind}", stages, legs, lengths,
                                   options.rounds, log_dir, shape.n_layer,
                                   HC_MULT * shape.n_embd * 4)
        ttft_report(ttfts)


if __name__ == "__main__":
    main()
