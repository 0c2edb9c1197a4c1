"""A bounded fuzz run of everything a worker decodes from the network: Forward and
ForwardStream requests, boundaries, gRPC Relay batches and local relay frames, random in
their fields and in their bytes. Nothing may crash the worker or grow it without bound,
and a well-formed session afterwards gets the unsplit model's tokens.

MESHNET_FUZZ_SECONDS (default 20) sets the length; MESHNET_FUZZ_SEED replays a run."""

from __future__ import annotations

import collections
import os
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, StageClient
from meshnet.route.proto import pb

ROUTE, EPOCH = "test/fuzz", 3
SESSIONS = [f"fuzz-{i}" for i in range(6)]
SERVICE = "/meshnet.shard.v1.ShardService/"


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))


class Fuzzer:
    """Random requests: mostly plausible (so checks deep in the worker are reached), some
    wild, and some with their serialized bytes mutated."""

    def __init__(self, rng: random.Random, boundary: pb.Boundary, n_vocab: int) -> None:
        self.rng = rng
        self.boundary = boundary
        self.n_vocab = n_vocab
        self.keys: set[tuple[str, int, str]] = set()  # every route key a worker may have opened

    def pick(self, *choices: object) -> object:
        return self.rng.choice(choices)

    def some_int(self, likely: int) -> int:
        return int(self.pick(likely, likely, likely, 0, -1, self.rng.randint(-1000, 1000),
                             2**31 - 1, -(2**31), self.rng.randint(0, 2**40)))

    def request(self, boundary: bool) -> pb.ForwardRequest:
        rng = self.rng
        r = pb.ForwardRequest()
        r.key.route_id = str(self.pick(ROUTE, ROUTE, ROUTE, "other/route", ""))
        r.key.epoch = int(self.pick(EPOCH, EPOCH, EPOCH, 0, EPOCH + 1, 2**62))
        r.key.session_id = str(self.pick(*SESSIONS, "", "x" * 5000))
        n = int(self.pick(1, 1, 2, 3, 0, rng.randint(0, 40), rng.randint(0, 3000)))
        r.n_past = self.some_int(0)
        start = r.n_past if rng.random() < 0.8 and abs(r.n_past) < 2**30 else rng.randint(-50, 5000)
        r.positions.extend(
            range(start, start + n) if rng.random() < 0.8
            else [rng.randint(-5, 5000) for _ in range(n)])
        if not boundary or rng.random() < 0.3:
            r.tokens.extend(rng.randint(0, self.n_vocab - 1) if rng.random() < 0.9
                            else rng.randint(-10, 2 * self.n_vocab) for _ in range(n))
        if boundary:
            self.fill_boundary(r.boundary, n)
        if rng.random() < 0.7:
            r.output.kind = int(self.pick(0, 1, 2, 3, 4, 4, 77))  # type: ignore[assignment]
        if rng.random() < 0.3:
            r.output.rows.extend(rng.randint(-2, n + 2) for _ in range(rng.randint(0, 6)))
        r.output.top_k = int(self.pick(0, 1, 5, -3, self.n_vocab, self.n_vocab + 1))
        sampling = r.output.sampling
        sampling.temperature = float(self.pick(0.0, 0.7, -1.0, float("nan"), float("inf")))
        sampling.top_k = int(self.pick(0, 10, -1, 2**31 - 1))
        sampling.top_p = float(self.pick(0.0, 0.9, 1.0, 1.5, float("nan")))
        sampling.seed = rng.randint(0, 2**64 - 1)
        r.relay = rng.random() < 0.2
        r.continue_tokens = int(self.pick(0, 0, 0, 0, 3, 100_000))
        r.stop_token_ids.extend(rng.randint(-3, self.n_vocab) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.2:
            r.expected_range.begin = rng.randint(-1, 40)
            r.expected_range.end = rng.randint(-1, 40)
        return r

    def fill_boundary(self, out: pb.Boundary, n: int) -> None:
        rng = self.rng
        out.CopyFrom(self.boundary)
        row_bytes = len(self.boundary.data) // max(1, self.boundary.shape[0])
        out.data = (self.boundary.data * (n // max(1, self.boundary.shape[0]) + 1))[:n * row_bytes]
        del out.shape[:]
        out.shape.extend([n, *self.boundary.shape[1:]])
        roll = rng.random()
        if roll < 0.1:
            out.dtype = int(self.pick(0, 1, 2, 3, 9))  # type: ignore[assignment]
        elif roll < 0.2:
            out.shape[rng.randrange(len(out.shape))] = int(self.pick(0, -1, 2**40, n + 1))
        elif roll < 0.3:
            out.data = out.data[:rng.randint(0, len(out.data))]
        elif roll < 0.35:
            out.data = struct.pack("<f", float("nan")) * (len(out.data) // 4)
        elif roll < 0.4:
            out.schema = int(self.pick(0, 1, 2, 3, 50))  # type: ignore[assignment]

    def mutate(self, data: bytes) -> bytes:
        rng = self.rng
        raw = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            roll = rng.random()
            if roll < 0.5 and raw:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            elif roll < 0.7 and raw:
                del raw[rng.randrange(len(raw)):]
            else:
                at = rng.randint(0, len(raw))
                raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return bytes(raw)

    def message(self, boundary: bool, relay_batch: bool = False) -> bytes:
        if relay_batch:
            batch = pb.RelayRequest(batch_id=self.rng.randint(0, 2**64 - 1))
            for _ in range(int(self.pick(0, 1, 1, 2, 5))):
                batch.steps.append(self.request(boundary))
            data = batch.SerializeToString()
        else:
            data = self.request(boundary).SerializeToString()
        if self.rng.random() < 0.3:
            data = self.mutate(data)
        self.remember_keys(data, relay_batch)
        return data

    def remember_keys(self, data: bytes, relay_batch: bool) -> None:
        """A mutated byte can name a session we never chose: parse the bytes as the worker
        does, so the test can release whatever they may have opened."""
        try:
            steps = (list(pb.RelayRequest.FromString(data).steps) if relay_batch
                     else [pb.ForwardRequest.FromString(data)])
        except DecodeError:  # undecodable bytes open no session
            return
        for step in steps:
            self.keys.add((step.key.route_id, step.key.epoch, step.key.session_id))


@pytest.fixture(scope="module")
def chain(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id=ROUTE, epoch=EPOCH,
                        slots=4,
                        ctx=256, batch=64, threads=1)
             for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("fuzz"), chain=True)
    yield workers
    for worker in workers:
        worker.stop()


def test_fuzzed_requests_crash_nothing_and_leave_exact_tokens(
    chain: list[WorkerProcess], reference: Callable[..., list[int]],
) -> None:
    seconds = float(os.environ.get("MESHNET_FUZZ_SECONDS", "20"))
    seed = int(os.environ.get("MESHNET_FUZZ_SEED", str(random.randrange(2**32))))
    print(f"fuzz seed {seed}, {seconds} s")
    first, last = chain
    key = route_key_of(chain)  # the fuzz reaches past the route key's check
    assert key is not None
    first_client, last_client = (StageClient(w.endpoint, route_key=key) for w in chain)
    info = last_client.info()
    real = first_client.forward(pb.ForwardRequest(
        key=pb.RouteKey(route_id=ROUTE, epoch=EPOCH, session_id="seed"), n_past=0,
        positions=[0, 1], tokens=[504, 3458]))
    first_client.release(pb.RouteKey(route_id=ROUTE, epoch=EPOCH, session_id="seed"))
    fuzz = Fuzzer(random.Random(seed), real.boundary, info.n_vocab)
    rss_before = {w.pid: rss_kib(w.pid) for w in chain}

    channels = {w.endpoint: grpc.insecure_channel(w.endpoint) for w in chain}

    def unary(worker: WorkerProcess) -> Callable[..., bytes]:
        return channels[worker.endpoint].unary_unary(  # type: ignore[no-any-return]
            SERVICE + "Forward", request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw)

    def streaming(worker: WorkerProcess, method: str) -> Callable[..., Iterator[bytes]]:
        return channels[worker.endpoint].stream_stream(  # type: ignore[no-any-return]
            SERVICE + method, request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw)

    codes: collections.Counter[str] = collections.Counter()
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        target = fuzz.rng.choice(["forward-first", "forward-last", "stream", "relay",
                                  "local-relay"])
        try:
            if target == "forward-first":
                unary(first)(fuzz.message(boundary=False), timeout=10, metadata=key.metadata())
            elif target == "forward-last":
                unary(last)(fuzz.message(boundary=True), timeout=10, metadata=key.metadata())
            elif target == "stream":
                messages = [fuzz.message(boundary=False) for _ in range(fuzz.rng.randint(1, 4))]
                for _ in streaming(first, "ForwardStream")(iter(messages), timeout=10,
                                                           metadata=key.metadata()):
                    pass
            elif target == "relay":
                messages = [fuzz.message(boundary=True, relay_batch=True)
                            for _ in range(fuzz.rng.randint(1, 3))]
                for _ in streaming(last, "Relay")(iter(messages), timeout=10,
                                                  metadata=key.metadata()):
                    pass
            else:
                info = last_client.info()
                local_relay(info, key.local_relay_token(info.incarnation), fuzz)
            codes["OK"] += 1
        except grpc.RpcError as error:
            codes[error.code().name] += 1  # type: ignore[attr-defined]
        sent += 1
        for worker in chain:
            assert worker.running(), f"worker {worker.spec.layers} died; fuzz seed {seed}"
    print(f"fuzz: {sent} requests, answers {dict(codes)}")
    for channel in channels.values():
        channel.close()

    assert sent > 50
    # The transport's own failures only: no deadline passed, nothing unknown.
    assert not set(codes) & {"DEADLINE_EXCEEDED", "UNKNOWN", "UNAVAILABLE"}, codes
    for route_id, epoch, session in fuzz.keys:
        if (route_id, epoch) != (ROUTE, EPOCH) or not 1 <= len(session.encode()) <= 256:
            continue  # refused before any session exists
        for client in (first_client, last_client):
            client.release(pb.RouteKey(route_id=route_id, epoch=epoch, session_id=session))
    for worker in chain:
        grown = rss_kib(worker.pid) - rss_before[worker.pid]
        assert grown < 256 * 1024, f"{worker.spec.layers} grew {grown} KiB; seed {seed}"
    assert first_client.capacity().slots_free == last_client.capacity().slots_free == 4
    with RouteDriver([w.endpoint for w in chain],
                     route_key=route_key_of(chain), topology="chain") as driver:
        prompt = driver.tokenize("The quick brown fox")
        assert driver.generate(prompt, max_tokens=8, stop_at_eos=False).tokens == \
            reference(prompt, 8)
    first_client.close()
    last_client.close()


def local_relay(info: pb.GetInfoResponse, right: bytes, fuzz: Fuzzer) -> None:
    """Random frames on the local relay, with the right token, a wrong one or none."""
    roll = fuzz.rng.random()
    token = right if roll < 0.8 else bytes(32) if roll < 0.9 else b""
    with socket.create_connection(("127.0.0.1", info.local_relay_port), timeout=10) as sock:
        payload = token
        for _ in range(fuzz.rng.randint(1, 3)):
            body = fuzz.message(boundary=True, relay_batch=True)
            header = struct.pack("<I", len(body) if fuzz.rng.random() < 0.9
                                 else fuzz.rng.randint(0, 2**32 - 1))
            payload += header + body
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):  # answers, until the worker closes its side
                pass
        except OSError:
            pass  # the worker closed a connection it could not go on with
