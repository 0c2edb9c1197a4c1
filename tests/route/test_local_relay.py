"""The local relay: chained stages on one host hand their steps over a plain loopback
socket instead of gRPC (see Relay in shard_service.proto), with the same tokens, and
back on gRPC with --local-relay off or under TLS."""

from __future__ import annotations

import re
import socket
import struct
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    new_route_key_file,
    route_key_of,
    start_route,
)
from meshnet.route import RouteDriver, StageClient, TlsFiles
from meshnet.route.proto import pb

from .conftest import closed_within

PROMPT = "A lighthouse keeper counts the ships that pass at night, and"


def relay_batches(worker: WorkerProcess) -> dict[str, int]:
    """The worker's meshnet_shard_relay_batches_total, by transport."""
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {transport: int(count) for transport, count in re.findall(
        r'^meshnet_shard_relay_batches_total\{transport="(\w+)"\} (\d+)$', text, re.M)}


def two_stage_chain(shard_worker: Path, smollm2: Path, logs: Path,
                    local_relay: bool = True) -> list[WorkerProcess]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/local-relay",
                        threads=1,
                        local_relay=local_relay)
             for span in [(0, 15), (15, 30)]]
    return start_route(shard_worker, specs, logs, chain=True)


def settle(driver: RouteDriver, prompt: list[int], next_stage: WorkerProcess,
           local_relay: bool = True, timeout: float = 15.0) -> None:
    """Generates a few tokens until they all reach `next_stage` over the transport
    expected: the first stage asks for the local relay from a watchdog, about once a
    second, and moves to it between batches."""
    transport = "local" if local_relay else "grpc"
    deadline = time.monotonic() + timeout
    while True:
        before = relay_batches(next_stage)
        driver.generate(prompt, max_tokens=4, stop_at_eos=False)
        after = relay_batches(next_stage)
        moved = {name: after[name] - before[name] for name in after}
        if moved[transport] > 0 and sum(moved.values()) == moved[transport]:
            return
        assert time.monotonic() < deadline, f"still relaying over {moved} after {timeout} s"
        time.sleep(0.3)


@pytest.fixture(params=["on", "off"])
def chain(request: pytest.FixtureRequest, shard_worker: Path, smollm2: Path,
          tmp_path: Path) -> Iterator[tuple[str, list[WorkerProcess]]]:
    workers = two_stage_chain(shard_worker, smollm2, tmp_path, request.param == "on")
    yield request.param, workers
    for worker in workers:
        worker.stop()


def test_chained_stages_on_one_host_relay_over_the_local_socket_with_the_same_tokens(
    chain: tuple[str, list[WorkerProcess]], reference: Callable[..., list[int]],
) -> None:
    local_relay, workers = chain
    with RouteDriver([w.endpoint for w in workers],
                     route_key=route_key_of(workers), topology="chain") as driver:
        prompt = driver.tokenize(PROMPT)
        settle(driver, prompt, workers[1], local_relay == "on")
        before = relay_batches(workers[1])
        generation = driver.generate(prompt, max_tokens=32, stop_at_eos=False)
        after = relay_batches(workers[1])
        offered = StageClient(workers[1].endpoint)
        port = offered.info().local_relay_port
        offered.close()
    assert generation.tokens == reference(prompt, 32)
    relayed = {transport: after[transport] - before[transport] for transport in after}
    if local_relay == "on":
        assert port > 0
        assert relayed["local"] >= 32 and relayed["grpc"] == 0
    else:
        assert port == 0
        assert relayed["grpc"] >= 32 and relayed["local"] == 0


@pytest.mark.slow
def test_a_restarted_next_stage_is_reached_again_over_the_local_relay(
    shard_worker: Path, smollm2: Path, tmp_path: Path, reference: Callable[..., list[int]],
) -> None:
    workers = two_stage_chain(shard_worker, smollm2, tmp_path)
    try:
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology="chain") as driver:
            prompt = driver.tokenize(PROMPT)
            driver.generate(prompt, max_tokens=4, stop_at_eos=False)
            workers[1].restart()  # same port, new incarnation and local relay port
            first = driver.generate(prompt, max_tokens=16, stop_at_eos=False)
            settle(driver, prompt, workers[1])
            before = relay_batches(workers[1])
            second = driver.generate(prompt, max_tokens=16, stop_at_eos=False)
            after = relay_batches(workers[1])
        assert first.tokens == second.tokens == reference(prompt, 16)
        assert after["local"] - before["local"] >= 16
        assert after["grpc"] == before["grpc"]
    finally:
        for worker in workers:
            worker.stop()


def test_a_worker_served_with_tls_offers_no_local_relay(
    shard_worker: Path, smollm2: Path, certificates: dict[str, Path],
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(15, 30), threads=1, slots=1, ctx=64,
                      tls_cert=certificates["server.pem"], tls_key=certificates["server.key"])
    with WorkerProcess(shard_worker, spec).start() as worker:
        client = StageClient(worker.endpoint, TlsFiles(ca=certificates["ca.pem"]))
        assert client.info().local_relay_port == 0
        client.close()


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data
    return exactly(struct.unpack("<I", exactly(4))[0])


def relay_token(workers: list[WorkerProcess], info: pb.GetInfoResponse) -> bytes:
    """What a holder of the route's key opens the local relay of the stage of `info` with."""
    key = route_key_of(workers)
    assert key is not None
    return key.local_relay_token(info.incarnation)


def test_the_local_relay_answers_bad_steps_and_drops_bad_frames_while_serving(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(15, 30), route_id="test/local-relay",
                      threads=1, slots=1, ctx=64, route_key_file=new_route_key_file(tmp_path))
    with WorkerProcess(shard_worker, spec).start() as worker:
        client = StageClient(worker.endpoint)
        info = client.info()
        port, token = info.local_relay_port, relay_token([worker], info)
        assert port > 0 and len(token) == 32
        # A well-formed batch whose step is wrong is answered, step by step, as Forward
        # would answer it.
        wrong_epoch = pb.RelayRequest(batch_id=7, steps=[pb.ForwardRequest(
            key=pb.RouteKey(route_id="test/local-relay", epoch=99, session_id="s"),
            n_past=0, positions=[0], tokens=[1])])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            body = wrong_epoch.SerializeToString()
            sock.sendall(token + struct.pack("<I", len(body)) + body)
            answer = pb.RelayResponse.FromString(read_frame(sock))
        assert answer.batch_id == 7 and len(answer.results) == 1
        assert answer.results[0].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert "epoch" in answer.results[0].message.lower()
        # A frame that does not parse, or one over the size limit, ends its connection.
        for frame in (struct.pack("<I", 5) + b"\xff" * 5, struct.pack("<I", 0xFFFFFFF0)):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(token + frame)
                assert sock.recv(1) == b""
        assert client.info().local_relay_port == port  # still serving
        client.close()


def process_facts(pid: int) -> tuple[int, int]:
    """A process's resident memory (KiB) and thread count."""
    status = Path(f"/proc/{pid}/status").read_text()
    facts = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(facts["VmRSS"].split()[0]), int(facts["Threads"])


def test_strangers_on_the_local_relay_are_refused_and_cost_neither_memory_nor_threads(
    shard_worker: Path, smollm2: Path, tmp_path: Path, reference: Callable[..., list[int]],
) -> None:
    workers = two_stage_chain(shard_worker, smollm2, tmp_path)
    try:
        last = workers[1]
        info = StageClient(last.endpoint).info()
        port, token = info.local_relay_port, relay_token(workers, info)
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology="chain") as driver:
            prompt = driver.tokenize(PROMPT)
            settle(driver, prompt, last)  # the first stage holds its local connection
            rss_before, threads_before = process_facts(last.pid)
            # A stranger's step for this route, without the token or with a wrong one:
            # closed, never run.
            step = pb.RelayRequest(batch_id=1, steps=[pb.ForwardRequest(
                key=pb.RouteKey(route_id="test/local-relay", epoch=1, session_id="x"),
                n_past=0, positions=[0], tokens=[1])]).SerializeToString()
            frame = struct.pack("<I", len(step)) + step
            for opening in (b"", bytes(32), token[:31] + bytes([token[31] ^ 1])):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    sock.sendall(opening + frame)
                    assert closed_within(sock, 5), opening
            # Headers announcing 100 MiB frames, from peers that know the token, and idle
            # connections that never send one: memory and threads stay flat; those over
            # the cap, and the silent ones after their grace, are closed.
            announcing = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
            for sock in announcing:
                sock.sendall(token + struct.pack("<I", 100 << 20))
            silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
            time.sleep(0.5)
            rss_during, threads_during = process_facts(last.pid)
            assert rss_during - rss_before < 32 * 1024, (rss_before, rss_during)
            assert threads_during <= threads_before, (threads_before, threads_during)
            assert all(closed_within(sock, 5) for sock in silent)
            # The route still gives the unsplit model's tokens meanwhile.
            generation = driver.generate(prompt, max_tokens=16, stop_at_eos=False)
            assert generation.tokens == reference(prompt, 16)
            for sock in announcing + silent:
                sock.close()
            settle(driver, prompt, last)  # and goes back to the local relay
    finally:
        for worker in workers:
            worker.stop()


def test_idle_holders_of_the_local_relay_are_closed_so_a_restarted_stage_gets_it_back(
    shard_worker: Path, smollm2: Path, tmp_path: Path, reference: Callable[..., list[int]],
) -> None:
    """Peers that know the token, connect and send nothing hold the relay's connections
    only for --local-relay-idle-ms: without it, holders filling the cap kept a restarted
    first stage on gRPC for as long as they liked."""
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/local-relay",
                        threads=1, extra=extra)
             for span, extra in [((0, 15), ()), ((15, 30), ("--local-relay-idle-ms", "1000"))]]
    workers = start_route(shard_worker, specs, tmp_path, chain=True)
    try:
        first, last = workers
        info = StageClient(last.endpoint).info()
        port, token = info.local_relay_port, relay_token(workers, info)
        first.stop()
        time.sleep(0.2)  # its connection is gone
        holders = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        for sock in holders:
            sock.sendall(token)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.sendall(token)
            assert closed_within(extra, 5)  # the cap (16) is full
        first.start()
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology="chain") as driver:
            prompt = driver.tokenize(PROMPT)
            settle(driver, prompt, last)  # the restarted stage relays locally again
            generation = driver.generate(prompt, max_tokens=16, stop_at_eos=False)
        assert generation.tokens == reference(prompt, 16)
        assert all(closed_within(sock, 1) for sock in holders)
        for sock in holders:
            sock.close()
    finally:
        for worker in workers:
            worker.stop()


def test_a_worker_on_a_unix_socket_offers_no_tcp_local_relay(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    address = f"unix:{tmp_path / 'stage.sock'}"
    spec = LaunchSpec(model=smollm2, layers=LayerRange(15, 30), threads=1, slots=1, ctx=64,
                      listen=address)
    worker = WorkerProcess(shard_worker, spec)
    worker.start()
    try:
        client = StageClient(address)
        assert client.info().local_relay_port == 0
        client.close()
    finally:
        worker.stop()
