"""Many large requests at once hold a worker's memory to its budget of requests in flight
and leave nothing held after them; the worker goes on serving."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from meshnet.layers import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.route import StageClient
from meshnet.route.proto import pb
from meshnet.route.stage import stage_error

MIB = 1 << 20
MAX_MESSAGE = 4 * MIB
TRANSPORT_LIMIT = 2 * MAX_MESSAGE + MIB  # what gRPC takes before the service's own check
BUDGET = 2 * TRANSPORT_LIMIT  # the worker's default here (a step of its one slot is smaller)
BURST, REQUEST = 64, 8 * MIB  # 512 MiB offered at once
TRIM_THRESHOLD = 16 * MIB  # freed memory a worker may keep before it gives it back


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_burst_of_large_requests_is_held_to_the_budget_and_memory_is_given_back(
        shard_worker: Path, smollm2: Path) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), route_id="test/memory", slots=1,
                      ctx=64, threads=1, max_message_bytes=MAX_MESSAGE)
    with WorkerProcess(shard_worker, spec).start() as worker:
        client = StageClient(worker.endpoint)
        key = pb.RouteKey(route_id="test/memory", epoch=1, session_id=uuid.uuid4().hex)
        client.forward(pb.ForwardRequest(key=key, n_past=0, positions=[0], tokens=[1]))
        baseline = rss(worker.pid)

        # Over the service's limit, under the transport's: each is refused, by the
        # service (MESSAGE_TOO_LARGE) or, past the budget, by gRPC before it is whole.
        request = pb.ForwardRequest(key=key, n_past=1, positions=[1], tokens=[2])
        request.boundary.data = b"\0" * REQUEST
        raw = request.SerializeToString()
        peak, done = [baseline], threading.Event()
        codes: list[str] = []

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss(worker.pid))
                time.sleep(0.005)

        def send() -> None:
            with grpc.insecure_channel(worker.endpoint) as channel:
                call = channel.unary_unary("/meshnet.shard.v1.ShardService/Forward",
                                           request_serializer=lambda r: r,
                                           response_deserializer=lambda r: r)
                with pytest.raises(grpc.RpcError) as caught:
                    call(raw, timeout=60)
                codes.append(stage_error(worker.endpoint, caught.value).code)

        watcher = threading.Thread(target=watch)
        senders = [threading.Thread(target=send) for _ in range(BURST)]
        watcher.start()
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        done.set()
        watcher.join()
        # Past the budget gRPC also closes idle connections (GOAWAY): a call sent on one
        # just then is UNAVAILABLE, for the client to send again.
        assert set(codes) <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
        assert codes.count("RESOURCE_EXHAUSTED") > BURST // 2

        # gRPC holds about the budget (a soft one: it reads on until it cancels), and
        # each request it hands on is decoded once more; without it all 512 MiB came in.
        rise = peak[0] - baseline
        assert rise < 2 * BUDGET + 8 * REQUEST, f"{rise / MIB:.0f} MiB over {baseline / MIB:.0f}"
        deadline = time.monotonic() + 10
        while rss(worker.pid) - baseline > TRIM_THRESHOLD and time.monotonic() < deadline:
            time.sleep(0.1)
        after = rss(worker.pid)
        print(f"RSS baseline {baseline / MIB:.0f} MiB, peak {peak[0] / MIB:.0f}, "
              f"after {after / MIB:.0f}")
        assert after - baseline <= 2 * TRIM_THRESHOLD, f"{(after - baseline) / MIB:.0f} MiB held"

        step = pb.ForwardRequest(key=key, n_past=1, positions=[1], tokens=[2])
        assert client.forward(step).n_past == 2
        client.close()
