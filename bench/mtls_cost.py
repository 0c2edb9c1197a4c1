"""What the operator's default mTLS costs a route on loopback.

    .venv/bin/python bench/mtls_cost.py [--tokens 96] [--rounds 3] [--calls 100]

Two SmolLM2 routes of two stages each (hub), one plaintext and one on a route identity
issued as the operator issues it (meshnet.pki; the stages on the stage identity with
client certificates required, the driver on the gateway identity), rendered by the
operator's own planner and argv renderer. Prints, interleaving the two so that a busy
host hurts both alike, the median of: a GetInfo round trip on an established channel
(the transport's price per RPC) and a decoded token (the price per step), and checks
that both routes decode the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from meshnet import pki
from meshnet.api.shardroute import LayerRange, Recipe, Stage
from meshnet.bundled import smollm2_gguf
from meshnet.local.process import LaunchSpec, WorkerProcess, worker_binary
from meshnet.reconcile.route.identity import (
    GATEWAY,
    STAGE,
    IssuedIdentity,
    LinkTls,
    link_tls,
    stage_hosts,
    stage_server_name,
    tls_volume,
)
from meshnet.reconcile.route.planner import stage_worker
from meshnet.reconcile.route.worker_command import worker_command
from meshnet.reconcile.route.workerspec import Identities
from meshnet.route import RouteDriver
from meshnet.route.stage import StageClient, TlsFiles
from meshnet.timestamps import utc_now

NS, ROUTE = "bench", "r1"
STAGES = [Stage(name="s0", layers=LayerRange(begin=0, end=15)),
          Stage(name="s1", layers=LayerRange(begin=15, end=30))]
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def lay_out(data: Mapping[str, bytes], tls: LinkTls, role: str, folder: Path) -> Path:
    """`role`'s files as its pod's tls volume shows them."""
    folder.mkdir()
    for item in tls_volume(tls, role)["secret"]["items"]:
        (folder / item["path"]).write_bytes(data[item["key"]])
    return folder


def start_route(stack: ExitStack, tls: LinkTls | None, folder: Path | None) -> list[str]:
    model = smollm2_gguf()
    endpoints = []
    for index in range(len(STAGES)):
        worker = stage_worker(STAGES, index, Recipe(), tls, 1,
                              Identities("a" * 64, "b" * 64, "c" * 64), model.name,
                              f"{NS}/{ROUTE}")
        command = worker_command(worker, model, "127.0.0.1:0", "127.0.0.1:0", {}, folder)
        process = WorkerProcess(worker_binary(), LaunchSpec.of(command, threads=1))
        endpoints.append(stack.enter_context(process.start()).endpoint)
    return endpoints


def rpc_seconds(client: StageClient, calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        client.info()
    return (time.perf_counter() - began) / calls


def token_seconds(endpoints: list[str], files: TlsFiles | None,
                  tokens: int) -> tuple[float, tuple[int, ...]]:
    with RouteDriver(endpoints, tls=files) as driver:
        driver.generate(PROMPT[:3], max_tokens=4, stop_at_eos=False)  # channels up
        began = time.perf_counter()
        out = driver.generate(PROMPT, max_tokens=tokens, stop_at_eos=False)
        spent = time.perf_counter() - began
    return spent / tokens, tuple(out.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        data = pki.issue(pki.Subject(NS, ROUTE, stage_hosts(ROUTE, NS, 1)), utc_now())
        tls = link_tls(None, IssuedIdentity(f"{ROUTE}-identity", "bench"))
        assert tls is not None
        stage_files = lay_out(data, tls, STAGE, Path(tmp, "stage"))
        gateway = lay_out(data, tls, GATEWAY, Path(tmp, "gateway"))
        files = TlsFiles(gateway / "ca.crt", gateway / "tls.crt", gateway / "tls.key",
                         stage_server_name(ROUTE, NS))
        routes = {"plaintext": (start_route(stack, None, None), None),
                  "mtls": (start_route(stack, tls, stage_files), files)}
        clients = {name: StageClient(endpoints[0], route_files, timeout=5)
                   for name, (endpoints, route_files) in routes.items()}
        rpc: dict[str, list[float]] = {name: [] for name in routes}
        step: dict[str, list[float]] = {name: [] for name in routes}
        outputs = set()
        for _ in range(options.rounds * 5):
            for name, client in clients.items():
                rpc[name].append(rpc_seconds(client, options.calls))
        for _ in range(options.rounds):
            for name, (endpoints, route_files) in routes.items():
                seconds, tokens = token_seconds(endpoints, route_files, options.tokens)
                step[name].append(seconds)
                outputs.add(tokens)
        for client in clients.values():
            client.close()
    for name in routes:
        print(f"{name}: GetInfo {statistics.median(rpc[name]) * 1e6:.0f} us, "
              f"decode {statistics.median(step[name]) * 1e3:.2f} ms/token "
              f"(medians of {len(rpc[name])}x{options.calls} calls, "
              f"{len(step[name])}x{options.tokens} tokens)")
    print(f"same tokens: {len(outputs) == 1}")
    if len(outputs) != 1:
        raise SystemExit("mTLS changed a token")


if __name__ == "__main__":
    main()
