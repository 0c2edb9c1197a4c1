"""Exactness of a lane's device, measured through real workers on SmolLM2 with every layer
offloaded (or none, on the CPU lane): split parity, step invariance and batch invariance,
each as rows whose logits differ in any bit and the largest |dlogit|.

    .venv/bin/python bench/lane_exactness.py --lane vulkan [--json out.json]

- split parity: a 2-stage route (0:15, 15:30) against the unsplit worker on the same
  device, teacher-forced on the unsplit model's greedy tokens (as certification does).
- step invariance: after each prefix, a step of n rows (n = 1..8, as a speculative verify
  window) against the same n rows fed one step at a time, row for row.
- batch invariance: S sessions stepping one row each at the same time (so the worker can
  share steps between them) against each session stepping alone.
- deepseek4 (the tiny 8-layer model of our generator): split parity of the parity tool
  (meshnet-range-parity, the same device for both sides), and the graph's ops that ran
  on the CPU rather than the lane's device (ops without a kernel there: ggml's scheduler
  splits the graph around them; GGML_SCHED_DEBUG=2 names them).

The CPU lane is the reference: every figure there is 0 (patches 0006-0013). On the vulkan
lane a host without a GPU runs Mesa's software device (lavapipe): its speed means nothing,
its exactness does, since it runs ggml-vulkan's real shaders and their choice of paths by
row count. Exit status 1 when any figure is not 0 (for a check), 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.certify.measure import forced_logits
from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route, worker_binary
from meshnet.local.vulkan import software_device_env
from meshnet.native.build import find_binary
from meshnet.parity import ParityError, run_parity
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS
from meshnet.route.driver import RouteDriver
from meshnet.route.errors import StageError
from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.stage import StageClient

# An offloaded stage whose probe finds shared steps inexact steps each session alone: the
# device's own shared steps are what the batch figure measures, so let them mix as upstream.
OFFLOADED_SHARING = ("--batching", "throughput")
TEXT = ("The history of mapmaking is a story of people trying to describe a world they could "
        "only see in pieces. Early charts recorded coastlines as sailors remembered them, with "
        "harbours, rocks and currents drawn from memory and rumour. Later surveyors measured "
        "angles and distances with chains and telescopes, and slowly the pieces fitted "
        "together into maps that a stranger could follow across a continent.")
TOPICS = ["the sea", "mountains", "a small village", "the printing press", "rain",
          "an old map", "trains", "the moon", "bees", "a lighthouse", "winter", "bread",
          "bridges", "the desert", "owls", "a library"]


@dataclass
class Figure:
    """Rows compared, rows with any differing bit, and the largest |dlogit| among them."""

    check: str
    rows: int = 0
    differing: int = 0
    max_abs_dlogit: float = 0.0

    def add(self, got: np.ndarray, want: np.ndarray) -> None:
        self.rows += 1
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            self.differing += 1
            self.max_abs_dlogit = max(self.max_abs_dlogit,
                                      float(np.max(np.abs(got - want))))

    def line(self) -> str:
        return (f"{self.check:<34} {self.differing:>4} of {self.rows:<4} rows differ"
                f"   max |dlogit| {self.max_abs_dlogit:.3g}")


def step(client: StageClient, route: RouteInfo, key: pb.RouteKey, tokens: Sequence[int],
         n_past: int, logits: bool) -> list[np.ndarray]:
    """One step of `tokens` on a one-stage route; the logits of every row when asked."""
    stage = route.stages[0]
    request = pb.ForwardRequest(key=key, n_past=n_past,
                                positions=range(n_past, n_past + len(tokens)),
                                expected_range=pb.LayerRange(begin=stage.begin, end=stage.end))
    request.tokens.extend(tokens)
    request.output.kind = pb.OUTPUT_KIND_LOGITS
    request.output.rows.extend(range(len(tokens)) if logits else [len(tokens) - 1])
    response = client.forward(request)
    return [np.asarray(row.logits, dtype=np.float32) for row in response.rows]


def new_key(route: RouteInfo) -> pb.RouteKey:
    return pb.RouteKey(route_id=route.route_id, epoch=route.epoch, session_id=uuid.uuid4().hex)


def release(client: StageClient, *keys: pb.RouteKey) -> None:
    for key in keys:
        with contextlib.suppress(StageError):
            client.release(key)


def split_parity(unsplit: RouteDriver, split: RouteDriver, prompt: list[int],
                 steps: int) -> Figure:
    want, tokens = forced_logits(unsplit.clients, unsplit.route, prompt, steps)
    got, _ = forced_logits(split.clients, split.route, prompt, steps, forced=tokens)
    figure = Figure("split parity 0:15,15:30 vs unsplit")
    for row_got, row_want in zip(got, want, strict=True):
        figure.add(row_got, row_want)
    return figure


def step_invariance(unsplit: RouteDriver, text: list[int], prefixes: Sequence[int],
                    widths: Sequence[int]) -> list[Figure]:
    client, route = unsplit.clients[0], unsplit.route
    figures = []
    for n in widths:
        figure = Figure(f"step of {n} rows vs {n} one-row steps")
        for prefix in prefixes:
            rows = text[prefix:prefix + n]
            window, single = new_key(route), new_key(route)
            try:
                step(client, route, window, text[:prefix], 0, logits=False)
                step(client, route, single, text[:prefix], 0, logits=False)
                together = step(client, route, window, rows, prefix, logits=True)
                for i, token in enumerate(rows):
                    alone = step(client, route, single, [token], prefix + i, logits=True)
                    figure.add(together[i], alone[0])
            finally:
                release(client, window, single)
        figures.append(figure)
    return figures


def batch_invariance(unsplit: RouteDriver, sessions: int, steps: int) -> Figure:
    """Each session: its prompt alone, then `steps` one-row steps of its greedy tokens,
    once with every session stepping at the same moment, once alone."""
    client, route = unsplit.clients[0], unsplit.route
    prompts = [unsplit.tokenize(f"<|im_start|>user\nWrite about {TOPICS[n % len(TOPICS)]}."
                                f"<|im_end|>\n<|im_start|>assistant\n")
               for n in range(sessions)]

    def solo(n: int) -> tuple[list[int], list[np.ndarray]]:
        key = new_key(route)
        try:
            row = step(client, route, key, prompts[n], 0, logits=False)[-1]
            tokens, rows = [], []
            for i in range(steps):
                tokens.append(int(np.argmax(row)))
                row = step(client, route, key, [tokens[-1]], len(prompts[n]) + i, True)[0]
                rows.append(row)
            return tokens, rows
        finally:
            release(client, key)

    alone = [solo(n) for n in range(sessions)]
    keys = [new_key(route) for _ in range(sessions)]
    together: list[list[np.ndarray]] = [[] for _ in range(sessions)]
    barrier = threading.Barrier(sessions)
    errors: list[BaseException] = []

    def concurrent(n: int) -> None:
        try:
            step(client, route, keys[n], prompts[n], 0, logits=False)
            for i, token in enumerate(alone[n][0]):
                barrier.wait()  # every session's step reaches the worker at once
                together[n].append(step(client, route, keys[n], [token],
                                        len(prompts[n]) + i, True)[0])
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=concurrent, args=(n,)) for n in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    release(client, *keys)
    if errors:
        raise errors[0]
    figure = Figure(f"{sessions} concurrent sessions vs solo")
    for n in range(sessions):
        for got, want in zip(together[n], alone[n][1], strict=True):
            figure.add(got, want)
    return figure


DS4_SPLITS = ["0:4,4:8", "0:1,1:2,2:3,3:8", "0:7,7:8"]
# ggml_backend_sched_print_assignments, once per scheduled graph: "## SPLIT #1: CPU # 2
# inputs", then "node #  12 (   MUL_MAT):   name (size) [  CPU    cause] ..." per node.
_GRAPH = re.compile(r"^## SPLIT #0: ", re.MULTILINE)
_SPLIT = re.compile(r"^## SPLIT #\d+: (\S+)", re.MULTILINE)
_NODE = re.compile(r"^node #\s*\d+ \(\s*([^)]*?)\): .*?\) \[\s*(\S+)", re.MULTILINE)


def deepseek4_parity(model: Path, lane: str, gpu_layers: int) -> Figure:
    figure = Figure(f"deepseek4 splits ({len(DS4_SPLITS)}) vs unsplit")
    try:
        report = run_parity(model, DS4_SPLITS, Workspace(workspace()), n_prompt=160,
                            n_decode=8, threads=2, lane=lane, gpu_layers=gpu_layers)
    except ParityError as exc:  # e.g. the device's driver crashed: a figure, not the end
        print(f"deepseek4 split parity: no report: {exc}", file=sys.stderr)
        figure.differing = figure.rows = len(DS4_SPLITS)
        figure.max_abs_dlogit = float("inf")
        return figure
    for outcome in report.splits:
        figure.rows += 1
        if outcome.error or outcome.max_abs_logit_diff != 0.0:
            figure.differing += 1
            figure.max_abs_dlogit = max(figure.max_abs_dlogit,
                                        outcome.max_abs_logit_diff or float("inf"))
    return figure


def deepseek4_cpu_ops(model: Path, lane: str, gpu_layers: int) -> tuple[int, dict[str, int]]:
    """The unsplit model's graph splits in a decode step (the parity tool's last) and, by
    op, that graph's nodes the scheduler put on the CPU."""
    binary = find_binary("meshnet-range-parity", Workspace(workspace()), lane)
    env = {**os.environ, "GGML_SCHED_DEBUG": "2"}
    env.update(software_device_env(env))
    proc = subprocess.run([str(binary), "--model", str(model), "--split", "0:8",
                           "--n-prompt", "16", "--n-decode", "2", "--threads", "2",
                           "--gpu-layers", str(gpu_layers), "--verbose"],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    graphs = _GRAPH.split(proc.stderr)
    if len(graphs) < 2:
        raise RuntimeError(f"no scheduled graph in the parity tool's output (exit "
                           f"{proc.returncode}): {proc.stderr[-500:]}")
    last = "## SPLIT #0: " + graphs[-1]
    ops: dict[str, int] = {}
    for op, backend in _NODE.findall(last):
        if backend.startswith("CPU"):
            ops[op] = ops.get(op, 0) + 1
    return len(_SPLIT.findall(last)), dict(sorted(ops.items(), key=lambda item: -item[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="vulkan", help="whose worker build to run")
    parser.add_argument("--gpu-layers", type=int, default=None,
                        help="default: every layer on the vulkan lane, none on cpu")
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="a worker build's bin/ (default: the lane's cached build)")
    parser.add_argument("--prefixes", default="17,40", help="step invariance prefix lengths")
    parser.add_argument("--widths", default="1,2,3,4,5,6,7,8", help="step widths to compare")
    parser.add_argument("--sessions", default="8", help="concurrent session counts")
    parser.add_argument("--steps", type=int, default=4, help="decode steps per session")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checks", default="split,step,batch,deepseek4",
                        help="which checks to run, comma-separated")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    options = parser.parse_args()
    gpu_layers = options.gpu_layers if options.gpu_layers is not None else (
        0 if options.lane == "cpu" else OFFLOAD_ALL_LAYERS)
    binary = (options.bin_dir / "meshnet-shard-worker" if options.bin_dir
              else worker_binary(lane=options.lane))
    model = smollm2_gguf()
    logs = Path(tempfile.mkdtemp(prefix="meshnet-lane-exactness-"))
    sessions = [int(s) for s in options.sessions.split(",")]
    checks = set(options.checks.split(","))
    figures: list[Figure] = []

    def spec(begin: int, end: int, name: str) -> LaunchSpec:
        return LaunchSpec(model=model, layers=LayerRange(begin, end), route_id=f"bench/{name}",
                          threads=options.threads, gpu_layers=gpu_layers,
                          slots=max([2, *sessions]), ctx=256, exit_with_parent=True,
                          extra=OFFLOADED_SHARING if gpu_layers else ())

    print(f"lane {options.lane}, gpu layers {gpu_layers}, worker {binary}, logs {logs}",
          file=sys.stderr)
    for part in ("unsplit", "split"):
        (logs / part).mkdir()
    workers: list[WorkerProcess] = []
    try:
        workers += start_route(binary, [spec(0, 30, "unsplit")], logs / "unsplit", timeout=600)
        if "split" in checks:
            workers += start_route(binary, [spec(0, 15, "split"), spec(15, 30, "split")],
                                   logs / "split", timeout=600)
        with RouteDriver([workers[0].endpoint]) as unsplit, \
                RouteDriver([w.endpoint for w in workers[1:]] or [workers[0].endpoint]) as split:
            unsplit.connect(wait=60)
            split.connect(wait=60)
            text = unsplit.tokenize(TEXT)
            if "split" in checks:
                figures.append(split_parity(unsplit, split, text[:40], 8))
                print(figures[-1].line(), flush=True)
            if "step" in checks:
                for figure in step_invariance(unsplit, text,
                                              [int(p) for p in options.prefixes.split(",")],
                                              [int(w) for w in options.widths.split(",")]):
                    figures.append(figure)
                    print(figure.line(), flush=True)
            if "batch" in checks:
                for count in sessions:
                    figures.append(batch_invariance(unsplit, count, options.steps))
                    print(figures[-1].line(), flush=True)
    finally:
        for worker in workers:
            worker.stop()
    graph: dict[str, object] = {}
    if "deepseek4" in checks:
        ds4 = write_tiny_deepseek4(logs / "ds4-small.gguf", SMALL, seed=1)
        figures.append(deepseek4_parity(ds4, options.lane, gpu_layers))
        print(figures[-1].line(), flush=True)
        splits, cpu_ops = deepseek4_cpu_ops(ds4, options.lane, gpu_layers)
        if not gpu_layers:  # everything runs on the CPU: nothing fell back to it
            cpu_ops = {}
        graph = {"deepseek4_graph_splits": splits, "deepseek4_cpu_ops": cpu_ops}
        print(f"deepseek4 decode step: {splits} graph splits; on the CPU (op: nodes): "
              f"{', '.join(f'{op}: {n}' for op, n in cpu_ops.items()) or 'none'}")
    if options.json:
        options.json.write_text(json.dumps(
            {"lane": options.lane, "gpu_layers": gpu_layers,
             "figures": [asdict(f) for f in figures], **graph}, indent=2) + "\n")
    return 1 if any(f.differing for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
