"""Tokenizing cannot take a stage down: a prompt of special-token strings once tokenized in
time quadratic in its length (192,000 tokens: 26 s), and four such requests at once kept
a first stage's GetInfo from answering for minutes. Text that cannot fit the context is
now refused from its bytes, and tokenizing runs on threads of its own."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.route.proto import pb, pb_grpc
from meshnet.route.stage import StageClient, stage_error

HUGE = "<|im_start|>" * 360_000  # 4.3 MB, ~360,000 tokens: the probe's chat requests
NORMAL = "A lighthouse keeper counts the ships that pass at night, and"
OPTIONS = [("grpc.max_send_message_length", 64 << 20),
           ("grpc.max_receive_message_length", 64 << 20)]


def timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def padded_get_info(channel: grpc.Channel, size: int) -> Callable[[], object]:
    """GetInfo carrying `size` bytes of an unknown field: what it costs to bring that many
    bytes to the worker and back an answer, with no tokenizing at all."""
    payload = b"x" * size
    length = bytearray()
    n = len(payload)
    while n > 0x7F:
        length.append(0x80 | (n & 0x7F))
        n >>= 7
    length.append(n)
    request = bytes([15 << 3 | 2]) + bytes(length) + payload  # field 15, length-delimited
    call = channel.unary_unary("/meshnet.shard.v1.ShardService/GetInfo",
                               response_deserializer=pb.GetInfoResponse.FromString)
    return lambda: call(request, timeout=60)


@pytest.fixture(scope="module")
def worker(shard_worker: Path, smollm2: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 15), route_id="test/flood", threads=1,
                      slots=1, ctx=512)
    log = tmp_path_factory.mktemp("flood") / "worker.log"
    with WorkerProcess(shard_worker, spec, log).start() as started:
        yield started


def test_a_burst_of_sessions_tokenizing_at_once_is_answered_not_refused(
        worker: WorkerProcess) -> None:
    """The stage tokenizes two texts at once and queues two: a burst of 32 sessions (the
    route tests' largest) once failed a route on the refusal. The client retries it."""
    client = StageClient(worker.endpoint)
    try:
        expected = client.tokenize(NORMAL * 40)
        with ThreadPoolExecutor(32) as pool:
            together = list(pool.map(lambda _: client.tokenize(NORMAL * 40), range(32)))
    finally:
        client.close()
    assert len(expected) > 200 and together == [expected] * 32


def test_a_flood_of_special_token_prompts_is_refused_at_once_and_starves_nothing(
        worker: WorkerProcess) -> None:
    with grpc.insecure_channel(worker.endpoint, options=OPTIONS) as channel:
        stub = pb_grpc.ShardServiceStub(channel)

        def info() -> object:
            return stub.GetInfo(pb.GetInfoRequest(), timeout=60)

        def normal() -> object:
            request = pb.TokenizeRequest(text=NORMAL, add_special=True)
            tokens = stub.Tokenize(request, timeout=60).tokens
            assert len(tokens) > 5
            return tokens

        # Baselines, in this run: the calls alone, and the huge prompt's bytes carried in.
        carry = padded_get_info(channel, len(HUGE))
        for warm in (info, normal, carry):
            warm()
        alone = max(statistics.median(timed(f) for _ in range(5)) for f in (info, normal))
        carried = statistics.median(timed(carry) for _ in range(3))
        bound = 10 * (alone + 4 * carried)  # the flood brings four such prompts at once

        refusals: list[tuple[str, str, float]] = []

        def huge() -> None:
            started = time.monotonic()
            try:
                stub.Tokenize(pb.TokenizeRequest(text=HUGE, add_special=True), timeout=120)
                refusals.append(("OK", "", time.monotonic() - started))
            except grpc.RpcError as exc:
                error = stage_error(worker.endpoint, exc)
                refusals.append((error.code, error.reason, time.monotonic() - started))

        flood = [threading.Thread(target=huge) for _ in range(4)]
        for thread in flood:
            thread.start()
        latencies: list[float] = []
        while any(thread.is_alive() for thread in flood) or len(latencies) < 10:
            latencies += [timed(info), timed(normal)]
        for thread in flood:
            thread.join()

    refused = [(code, reason) for code, reason, _ in refusals]
    assert refused == [("OUT_OF_RANGE", "CONTEXT_OVERFLOW")] * 4
    assert max(seconds for _, _, seconds in refusals) < bound, (refusals, bound)
    assert max(latencies) < bound, (max(latencies), bound, alone, carried)
