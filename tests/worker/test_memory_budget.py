"""Many large requests at once hold a worker's memory to its budget of requests in flight
and leave nothing held after them; the worker goes on serving."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.route import StageClient
from meshnet.route.proto import pb
from meshnet.route.stage import stage_error

MIB = 1 << 20
MAX_MESSAGE = 4 * MIB
TRANSPORT_LIMIT = 2 * MAX_MESSAGE + MIB  # what gRPC takes before the service's own check
# The worker's default budget here: a step of every slot (8 x 256 tokens of boundary) is less.
BUDGET = 2 * TRANSPORT_LIMIT
REQUEST = 8 * MIB  # over the service's limit, under the transport's
TRIM_THRESHOLD = 16 * MIB  # freed memory a worker may keep before it gives it back
ROUTE_ID = "test/memory"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def worker(shard_worker: Path, smollm2: Path) -> Iterator[WorkerProcess]:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), route_id=ROUTE_ID, slots=8,
                      ctx=64, batch=256, threads=1, max_message_bytes=MAX_MESSAGE)
    with WorkerProcess(shard_worker, spec).start() as started:
        yield started


def key() -> pb.RouteKey:
    return pb.RouteKey(route_id=ROUTE_ID, epoch=1, session_id=uuid.uuid4().hex)


def oversized(session: pb.RouteKey) -> bytes:
    request = pb.ForwardRequest(key=session, n_past=1, positions=[1], tokens=[2])
    request.boundary.data = b"\0" * REQUEST
    return request.SerializeToString()


def burst(worker: WorkerProcess, callers: int, call: Callable[[], None]) -> tuple[int, int, int]:
    """RSS before, at the peak while `callers` threads run `call`, and once the worker
    gave back what it could (or 10 s passed); then checks it still serves."""
    client = StageClient(worker.endpoint)
    session = key()
    client.forward(pb.ForwardRequest(key=session, n_past=0, positions=[0], tokens=[1]))
    baseline = rss(worker.pid)
    peak, done = [baseline], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss(worker.pid))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    threads = [threading.Thread(target=call) for _ in range(callers)]
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    deadline = time.monotonic() + 10
    while rss(worker.pid) - baseline > TRIM_THRESHOLD and time.monotonic() < deadline:
        time.sleep(0.1)
    after = rss(worker.pid)
    print(f"RSS baseline {baseline / MIB:.0f} MiB, peak {peak[0] / MIB:.0f}, "
          f"after {after / MIB:.0f}")
    step = pb.ForwardRequest(key=session, n_past=1, positions=[1], tokens=[2])
    assert client.forward(step).n_past == 2
    client.release(session)
    client.close()
    return baseline, peak[0], after


def held_to_the_budget(baseline: int, peak: int, after: int) -> None:
    # gRPC holds about the budget (a soft one: it reads on until it cancels), and each
    # request it hands on is decoded once more; then what was freed goes back.
    assert peak - baseline < 2 * BUDGET + 8 * REQUEST, f"{(peak - baseline) / MIB:.0f} MiB"
    assert after - baseline <= 2 * TRIM_THRESHOLD, f"{(after - baseline) / MIB:.0f} MiB held"


def test_a_burst_of_large_requests_is_held_to_the_budget_and_memory_is_given_back(
        worker: WorkerProcess) -> None:
    raw, codes = oversized(key()), []

    def send() -> None:
        with grpc.insecure_channel(worker.endpoint) as channel:
            call = channel.unary_unary("/meshnet.shard.v1.ShardService/Forward",
                                       request_serializer=lambda r: r,
                                       response_deserializer=lambda r: r)
            with pytest.raises(grpc.RpcError) as caught:
                call(raw, timeout=60)
            codes.append(stage_error(worker.endpoint, caught.value).code)

    held_to_the_budget(*burst(worker, 64, send))  # 512 MiB offered at once
    # Refused by the service (MESSAGE_TOO_LARGE) or, past the budget, by gRPC before it
    # is whole; gRPC then also closes idle connections (GOAWAY): a call sent on one just
    # then is UNAVAILABLE, for the client to send again.
    assert set(codes) <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
    assert codes.count("RESOURCE_EXHAUSTED") > 64 // 2


def loop_then_oversized(worker: WorkerProcess, count: int) -> tuple[int, str, str]:
    """A stream running a decode loop of 24 tokens, `count` oversized steps sent behind
    it: the answers it got, then its status code and reason."""
    session = key()
    loop = pb.ForwardRequest(key=session, n_past=0, positions=[0], tokens=[1], continue_tokens=24)
    loop.output.kind = pb.OUTPUT_KIND_SAMPLED
    big = pb.ForwardStreamRequest(forward=pb.ForwardRequest.FromString(oversized(session)))
    messages = [pb.ForwardStreamRequest(forward=loop).SerializeToString()]
    messages += [big.SerializeToString()] * count
    answers = 0
    with grpc.insecure_channel(worker.endpoint) as channel:
        call = channel.stream_stream("/meshnet.shard.v1.ShardService/ForwardStream",
                                     request_serializer=lambda r: r,
                                     response_deserializer=pb.ForwardStreamResponse.FromString)
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call(iter(messages), timeout=60):
                answers += 1
    error = stage_error(worker.endpoint, caught.value)
    return answers, error.code, error.reason


def test_an_oversized_step_behind_a_decode_loop_is_refused_after_the_loop_answers(
        worker: WorkerProcess) -> None:
    # Refused as it comes (not kept until its turn), answered in its turn.
    assert loop_then_oversized(worker, 1) == (25, "RESOURCE_EXHAUSTED", "MESSAGE_TOO_LARGE")


def test_streams_queueing_large_requests_behind_decode_loops_are_held_too(
        worker: WorkerProcess) -> None:
    outcomes: list[tuple[int, str, str]] = []
    # 6 x 6 x 8 MiB offered, 16 times the budget; 6 streams, as the 8 slots also hold the
    # burst's own session and maybe the last test's loop (still within --evict-idle-ms):
    # a ninth session would rightly be refused CAPACITY_EXHAUSTED, before any answer
    held_to_the_budget(*burst(worker, 6, lambda: outcomes.append(loop_then_oversized(worker, 6))))
    # Refused by the service after the loop's answers, or past the budget by gRPC, which
    # may also close a connection whose buffers are full (GOAWAY): that stream's call is
    # UNAVAILABLE, for the client to send again, as in the burst above.
    codes = [code for _, code, _ in outcomes]
    assert set(codes) <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}, outcomes
    assert "RESOURCE_EXHAUSTED" in codes, outcomes
    assert all(answers == 25 for answers, _, reason in outcomes if reason), outcomes
