"""The worker's surface beside Forward: identities, health, capacity, /metrics, release
on cancellation, TLS and mTLS, and `meshnet worker run`."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshnet.api.shardroute import LayerRange, Recipe
from meshnet.digests import recipe_digest
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    free_port,
    local_manifest_digest,
    new_route_key_file,
    route_key_of,
    start_route,
)
from meshnet.operator.settings import OperatorSettings
from meshnet.route import RouteDriver, StageClient, StageError, TlsFiles
from meshnet.route.proto import pb


def test_get_info_reports_the_identities_it_was_started_with(
    shard_worker: Path, smollm2: Path,
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(10, 30), route_id="ns/route", epoch=12,
                      manifest_digest="a" * 64, recipe_digest="b" * 64, route_digest="c" * 64,
                      threads=1, slots=3, ctx=256, boundary_dtype="f16")
    with WorkerProcess(shard_worker, spec).start() as worker:
        client = StageClient(worker.endpoint)
        info = client.info()
        client.close()
    assert (info.route_id, info.epoch) == ("ns/route", 12)
    assert (info.manifest_digest, info.recipe_digest, info.route_digest) == (
        "a" * 64, "b" * 64, "c" * 64)
    assert (info.layers.begin, info.layers.end, info.n_layer) == (10, 30, 30)
    assert info.protocol == "meshnet.shard.v1"
    assert info.boundary.dtype == pb.BOUNDARY_DTYPE_F16
    assert info.boundary.schema == pb.BOUNDARY_SCHEMA_DENSE_RESIDUAL
    assert list(info.boundary.row_shape) == [info.n_embd]
    assert (info.n_slots, info.n_ctx) == (3, 256)
    assert len(info.incarnation) == 32


def test_get_info_says_where_the_stage_computes(shard_worker: Path, smollm2: Path) -> None:
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    first_cpu = min(os.sched_getaffinity(0))
    unbound = LaunchSpec(model=smollm2, layers=LayerRange(0, 10), threads=1, slots=1, ctx=64)
    bound = LaunchSpec(model=smollm2, layers=LayerRange(0, 10), threads=2, slots=1, ctx=64,
                       cpus=(first_cpu, first_cpu))
    placements = []
    for spec in (unbound, bound):
        with WorkerProcess(shard_worker, spec).start() as worker:
            client = StageClient(worker.endpoint)
            placements.append(client.info().placement)
            client.close()
    assert placements[0].host_id == placements[1].host_id == boot_id
    # unbound: the CPUs this process (its parent) may use; bound: those of --cpus
    assert list(placements[0].cpus) == sorted(os.sched_getaffinity(0))
    assert list(placements[1].cpus) == [first_cpu]
    assert (placements[0].threads, placements[1].threads) == (1, 2)
    assert placements[0].gpu_layers == placements[1].gpu_layers == 0


def worker_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_workers_get_a_short_openmp_spin_unless_the_caller_sets_one(
    shard_worker: Path, smollm2: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 10), threads=1, slots=1, ctx=64)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with WorkerProcess(shard_worker, spec).start() as worker:
        assert worker_environ(worker.pid)["GOMP_SPINCOUNT"] == "3000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "250")
    with WorkerProcess(shard_worker, spec).start() as worker:
        assert worker_environ(worker.pid)["GOMP_SPINCOUNT"] == "250"
    with WorkerProcess(shard_worker, spec, env={"GOMP_SPINCOUNT": "7"}).start() as worker:
        assert worker_environ(worker.pid)["GOMP_SPINCOUNT"] == "7"


def test_exit_with_parent_refuses_a_pid_that_is_not_its_parent(
    shard_worker: Path, smollm2: Path,
) -> None:
    result = subprocess.run(
        [str(shard_worker), "--model", str(smollm2), "--layers", "0:10",
         "--exit-with-parent", str(os.getppid())],  # our parent, not the worker's
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "the parent is gone" in result.stderr


def test_a_restarted_worker_has_a_new_incarnation(shard_worker: Path, smollm2: Path) -> None:
    with WorkerProcess(shard_worker, LaunchSpec(model=smollm2, layers=LayerRange(0, 30),
                                                threads=1)) as w:
        w.start()
        client = StageClient(w.endpoint)
        before = client.info().incarnation
        w.restart()
        assert client.info().incarnation != before
        client.close()


def test_health_capacity_and_metrics_reflect_the_work_done(
    two_stages: list[WorkerProcess],
) -> None:
    first = two_stages[0]
    channel = grpc.insecure_channel(first.endpoint)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "meshnet.shard.v1.ShardService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()

    client = StageClient(first.endpoint)
    key = pb.RouteKey(route_id="test/bad-input", epoch=7, session_id=uuid.uuid4().hex)
    client.forward(pb.ForwardRequest(key=key, n_past=0, positions=[0, 1, 2], tokens=[1, 2, 3]))
    capacity = client.capacity()
    assert capacity.slots_total == 2
    assert capacity.active_sessions >= 1
    assert capacity.kv_tokens_total - capacity.kv_tokens_free >= 3
    assert capacity.recent_tokens_per_second > 0

    url = f"http://127.0.0.1:{first.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for name in ('meshnet_shard_requests_total{rpc="Forward",code="OK"}',
                 "meshnet_shard_forward_latency_seconds_bucket",
                 "meshnet_shard_tokens_processed_total", "meshnet_shard_active_sessions",
                 "meshnet_shard_kv_tokens_used", "meshnet_shard_kv_tokens_capacity",
                 'meshnet_shard_boundary_bytes_total{direction="out"}'):
        assert name in text
    client.release(key)
    client.close()


def test_a_cancelled_stream_frees_its_sessions_slot(two_stages: list[WorkerProcess]) -> None:
    client = StageClient(two_stages[0].endpoint)
    key = pb.RouteKey(route_id="test/bad-input", epoch=7, session_id=uuid.uuid4().hex)
    free_before = client.capacity().slots_free
    pending: queue.Queue[pb.ForwardStreamRequest | None] = queue.Queue()
    pending.put(pb.ForwardStreamRequest(forward=pb.ForwardRequest(
        key=key, n_past=0, positions=[0, 1], tokens=[5, 6])))

    def feed():  # type: ignore[no-untyped-def]
        while (item := pending.get()) is not None:
            yield item

    stream = client._stub.ForwardStream(feed())
    assert next(stream).forward.n_past == 2
    assert client.capacity().slots_free == free_before - 1
    stream.cancel()
    pending.put(None)
    deadline = time.monotonic() + 5
    while client.capacity().slots_free != free_before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.capacity().slots_free == free_before
    with pytest.raises(StageError) as caught:
        client.forward(pb.ForwardRequest(key=key, n_past=2, positions=[2], tokens=[7]))
    assert caught.value.reason == "CACHE_MISS"
    client.close()


def test_a_stream_sending_faster_than_it_is_served_is_held_back_not_buffered(
    shard_worker: Path, smollm2: Path, reference: Callable[..., list[int]],
) -> None:
    """While a decode loop runs, a client pushes 20,000 messages of ~8 KB down the same
    ForwardStream: the stage reads a few ahead and lets flow control hold the rest back
    (they once all queued), and then still serves exact tokens."""
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), threads=1, slots=2)
    with WorkerProcess(shard_worker, spec).start() as worker:
        key = pb.RouteKey(route_id="local", epoch=1, session_id=uuid.uuid4().hex)
        step = pb.ForwardRequest(key=key, n_past=0, positions=[0, 1, 2], tokens=[504, 3458, 314],
                                 continue_tokens=400)
        step.output.kind = pb.OUTPUT_KIND_SAMPLED
        pushed = 0

        def messages():  # type: ignore[no-untyped-def]
            nonlocal pushed
            yield pb.ForwardStreamRequest(forward=step).SerializeToString()
            junk = pb.ForwardStreamRequest(forward=pb.ForwardRequest(tokens=[7] * 4000))
            for _ in range(20_000):
                pushed += 1
                yield junk.SerializeToString()

        channel = grpc.insecure_channel(worker.endpoint)
        stream = channel.stream_stream(
            "/meshnet.shard.v1.ShardService/ForwardStream",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ForwardStreamResponse.FromString)(messages())
        seen: dict[int, int] = {}  # answers so far -> messages the client got in
        for answers, _ in enumerate(stream, start=1):
            if answers in (150, 300):
                seen[answers] = pushed
            if answers == 300:
                break
        stream.cancel()
        channel.close()
        assert sorted(seen) == [150, 300]
        # The client is held back: an unbounded reader took all 20,000 (about 160 MB)
        # before the 150th token; now a few thousand at most, and none more over 150
        # tokens of the loop.
        assert seen[150] < 5_000 and seen[300] - seen[150] < 500, seen
        with RouteDriver([worker.endpoint]) as driver:
            prompt = driver.tokenize("The capital of France is")
            tokens = driver.generate(prompt, max_tokens=8, stop_at_eos=False).tokens
        assert tokens == reference(prompt, 8)


def _still_held(sock: socket.socket) -> bool:
    """Whether the worker still holds this connection open (it sent nothing back)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # data: not a held request either, but not let go
    except BlockingIOError:
        return True
    except OSError:  # reset
        return False


def _scrape_answers_while_idle_clients_are_held(port: int) -> bool:
    """Scrapes the metrics port behind 200 idle clients, half of them dribbling a request
    that never completes: whether the answer came while the worker still held the last
    of them (it lets an idle client go 2 s after taking it, so a scrape that waited for
    the idle clients answers only after they are gone)."""
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        for sock in idle[100:]:
            sock.sendall(b"GET /metr")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
            assert b"meshnet_shard_" in response.read()
        return _still_held(idle[-1])
    finally:
        for sock in idle:
            sock.close()


def test_idle_connections_do_not_starve_metrics_or_service(
    shard_worker: Path, smollm2: Path, reference: Callable[..., list[int]], tmp_path: Path,
) -> None:
    """200 idle connections on each port (gRPC, local relay, metrics), some dribbling a
    byte now and then: a scrape still answers while they are held, and the service still
    serves. The order of events is the property, not a time: a starved scrape is
    answered after the worker let the idle clients go, in every round; a busy machine
    that stalls this test between the answer and the check may spoil one round."""
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), threads=1, slots=1,
                      route_key_file=new_route_key_file(tmp_path))  # it offers a local relay
    with WorkerProcess(shard_worker, spec).start() as worker:
        relay_port = StageClient(worker.endpoint).info().local_relay_port
        assert relay_port > 0
        held = [socket.create_connection(("127.0.0.1", port))
                for port in (worker.port, relay_port) for _ in range(200)]
        try:
            assert any(_scrape_answers_while_idle_clients_are_held(worker.metrics_port)
                       for _ in range(3)), "every scrape waited for the idle clients to go"
            with RouteDriver([worker.endpoint], route_key=route_key_of([worker])) as driver:
                prompt = driver.tokenize("The capital of France is")
                assert driver.generate(prompt, max_tokens=4, stop_at_eos=False).tokens == \
                    reference(prompt, 4)
        finally:
            for sock in held:
                sock.close()


def test_tls_and_mtls_serve_only_clients_that_trust_and_are_trusted(
    shard_worker: Path, smollm2: Path, certificates: dict[str, Path],
) -> None:
    certs = certificates
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), threads=1,
                      tls_cert=certs["server.pem"],
                      tls_key=certs["server.key"], tls_client_ca=certs["ca.pem"])
    with WorkerProcess(shard_worker, spec).start() as worker:
        mutual = TlsFiles(ca=certs["ca.pem"], cert=certs["client.pem"], key=certs["client.key"])
        with RouteDriver([worker.endpoint], tls=mutual) as driver:
            assert len(driver.generate([1, 2, 3], max_tokens=2, stop_at_eos=False).tokens) == 2
        anonymous = StageClient(worker.endpoint, TlsFiles(ca=certs["ca.pem"]), timeout=5)
        with pytest.raises(StageError) as caught:
            anonymous.info()
        assert caught.value.code == "UNAVAILABLE"
        anonymous.close()
        plaintext = StageClient(worker.endpoint, timeout=5)
        with pytest.raises(StageError):
            plaintext.info()
        plaintext.close()


@pytest.mark.parametrize("topology", ["chain", "ring"])
@pytest.mark.parametrize("mode", ["server-only", "mutual"])
def test_a_tls_chain_relays_with_server_only_tls_and_with_mtls(
    shard_worker: Path, smollm2: Path, certificates: dict[str, Path], tmp_path: Path,
    reference: Callable[..., list[int]], mode: str, topology: str,
) -> None:
    """Also the ring, whose back edge is a link like --next-stage's, with its security; and
    pipelined speculation over either, with the plain tokens."""
    certs = certificates
    mutual = mode == "mutual"
    stage = LaunchSpec(model=smollm2, layers=LayerRange(0, 15), threads=1,
                       tls_cert=certs["server.pem"],
                       tls_key=certs["server.key"],
                       tls_client_ca=certs["ca.pem"] if mutual else None)
    # Server-only: the link trusts the next stage's CA, which asks no client certificate.
    specs = [replace(stage, next_stage_ca=None if mutual else certs["ca.pem"]),
             replace(stage, layers=LayerRange(15, 30))]
    workers = start_route(shard_worker, specs, tmp_path, chain=True, ring=topology == "ring")
    client_files = TlsFiles(ca=certs["ca.pem"], cert=certs["client.pem"] if mutual else None,
                            key=certs["client.key"] if mutual else None)
    try:
        with RouteDriver([w.endpoint for w in workers],
                         route_key=route_key_of(workers), topology=topology,
                         tls=client_files) as driver:
            driver.connect(wait=30.0)
            prompt = driver.tokenize("The capital of France is")
            generation = driver.generate(prompt, max_tokens=8, stop_at_eos=False)
            copied = "a = 1\nb = 2\nc = 3\n# again:\na = 1\nb = 2\nc = 3\n# again:\n"
            plain = driver.generate(copied, max_tokens=16, stop_at_eos=False)
            piped = driver.generate(copied, max_tokens=16, stop_at_eos=False, speculate=4,
                                    windows=3)
        assert generation.tokens == reference(prompt, 8)
        assert generation.topology == topology
        assert piped.tokens == plain.tokens
        assert piped.accepted_draft_tokens > 0
    finally:
        for worker in workers:
            worker.stop()


def test_a_tls_chain_without_a_ca_for_the_next_stage_fails_at_once_naming_the_fix(
    shard_worker: Path, smollm2: Path, certificates: dict[str, Path],
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 15), threads=1, next_stage="127.0.0.1:1",
                      tls_cert=certificates["server.pem"], tls_key=certificates["server.key"])
    done = subprocess.run([str(shard_worker), *spec.args()], capture_output=True, text=True,
                          timeout=30)
    # 2: refused with its flags, before loading the model or dialling the next stage (a
    # time bound said "at once" before, and a busy machine overran it)
    assert done.returncode == 2, done.stderr
    assert "--next-stage-ca" in done.stderr


def test_meshnet_generate_reaches_an_mtls_worker_with_the_tls_options(
    shard_worker: Path, smollm2: Path, certificates: dict[str, Path],
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 30), threads=1,
                      tls_cert=certificates["server.pem"], tls_key=certificates["server.key"],
                      tls_client_ca=certificates["ca.pem"])
    meshnet = Path(sys.executable).parent / "meshnet"
    with WorkerProcess(shard_worker, spec).start() as worker:
        command = [str(meshnet), "generate", "--stage", worker.endpoint, "--prompt", "Hi",
                   "--max-tokens", "3", "--ignore-eos", "--json"]
        tls = ["--tls-ca", str(certificates["ca.pem"]), "--tls-cert",
               str(certificates["client.pem"]), "--tls-key", str(certificates["client.key"])]
        answer = subprocess.run([*command, *tls], capture_output=True, text=True, timeout=120)
        plaintext = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert len(json.loads(answer.stdout)["tokens"]) == 3
    assert plaintext.returncode != 0


def test_meshnet_worker_run_starts_the_worker_with_computed_identities(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    port, metrics = free_port(), free_port()
    meshnet = Path(sys.executable).parent / "meshnet"
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        [str(meshnet), "worker", "run", "--model", str(smollm2), "--layers", "0:30",
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}",
         "--threads", "1", "--route-id", "cli/route", "--epoch", "3", "--no-local-relay",
         # worker flags `worker run` does not spell itself pass through
         "--prefix-cache-entries", "4", "--prefix-block", "16"],
        stdout=subprocess.DEVNULL, stderr=log, text=True,
        env={**os.environ, "MESHNET_BIN_DIR": str(shard_worker.parent)},
    )
    try:
        client = StageClient(f"127.0.0.1:{port}", timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                info = client.info()
                break
            except StageError:
                assert process.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert (info.route_id, info.epoch) == ("cli/route", 3)
        assert info.manifest_digest == local_manifest_digest(smollm2)
        # what the planner gives a route of the default recipe, on the operator's pin
        pin = OperatorSettings.from_env({}).pin_digest
        assert info.recipe_digest == recipe_digest(pin, Recipe().identity())
        assert info.local_relay_port == 0  # --no-local-relay reached the worker
        assert info.prefix_block == 16  # and so did the flags passed through
        client.close()
    finally:
        process.terminate()
        assert process.wait(10) == 0
        log.close()


def test_meshnet_worker_run_refuses_worker_flags_the_worker_refuses(smollm2: Path) -> None:
    meshnet = Path(sys.executable).parent / "meshnet"
    base = [str(meshnet), "worker", "run", "--model", str(smollm2), "--layers", "0:30",
            "--manifest-digest", "0" * 64]  # no hashing of the model to refuse
    for extra, message in ((["--prefix-blok", "16"], "the worker refuses '--prefix-blok 16'"),
                           (["--local-relay", "off"], "the worker refuses 'off'")):
        result = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr


def _thread_cpus(pid: int) -> dict[str, str]:
    """Each thread of a process: its name and the CPUs it may run on."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        allowed = next(line.split()[1] for line in status.splitlines()
                       if line.startswith("Cpus_allowed_list"))
        threads[f"{task.name} {(task / 'comm').read_text().strip()}"] = allowed
    return threads


def test_meshnet_worker_run_binds_the_compute_threads_to_the_cpus_given(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    port = free_port()
    meshnet = Path(sys.executable).parent / "meshnet"
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        [str(meshnet), "worker", "run", "--model", str(smollm2), "--layers", "0:30",
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", "", "--threads", "2",
         "--cpus", f"{cpus[1]},{cpus[0]}"],
        stdout=subprocess.DEVNULL, stderr=log, text=True,
        env={**os.environ, "MESHNET_BIN_DIR": str(shard_worker.parent)},
    )
    try:
        driver = RouteDriver([f"127.0.0.1:{port}"])
        driver.connect(wait=60)
        driver.generate(driver.tokenize("Bind me"), max_tokens=2)  # the compute team exists now
        driver.close()
        threads = _thread_cpus(process.pid)  # execve: the worker kept the pid
        # The first CPU listed takes every thread but the second compute thread of each
        # OpenMP team: the engine thread's, and the start-up exactness probe's (it steps on
        # the main thread, before the engine thread exists).
        on_second = [name for name, allowed in threads.items() if allowed == str(cpus[0])]
        assert 1 <= len(on_second) <= 2, threads
        assert all(name.endswith("meshnet-shard-w") for name in on_second), threads
        assert all(allowed == str(cpus[1]) for name, allowed in threads.items()
                   if name not in on_second), threads
    finally:
        process.terminate()
        assert process.wait(10) == 0
        log.close()


def test_meshnet_worker_run_refuses_cpus_it_cannot_use(smollm2: Path) -> None:
    meshnet = Path(sys.executable).parent / "meshnet"
    unavailable = max(os.sched_getaffinity(0)) + 1
    for value, message in ((str(unavailable), f"CPU(s) {unavailable} not available"),
                           ("0,x", "expected CPU numbers separated by commas")):
        result = subprocess.run(
            [str(meshnet), "worker", "run", "--model", str(smollm2), "--layers", "0:30",
             "--cpus", value], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr


def test_a_restart_on_the_same_inputs_recalls_its_exactness_and_a_changed_flag_measures(
        shard_worker: Path, smollm2: Path, tmp_path: Path, exactness_cache: Path) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(0, 4), threads=1, slots=2, ctx=72)
    infos, logs = [], []
    # the third start changes a flag, the fourth a variable that chooses kernel paths
    starts = [(spec, None), (spec, None), (replace(spec, slots=3), None),
              (spec, {"MESHNET_VK_UPSTREAM_PATHS": "1"})]
    for i, (flagged, env) in enumerate(starts):
        log = tmp_path / f"worker-{i}.log"
        worker = WorkerProcess(shard_worker, flagged, log, env).start()
        try:
            infos.append(StageClient(worker.endpoint, timeout=10).info())
        finally:
            worker.stop()
        logs.append(log.read_text())

    assert any(exactness_cache.iterdir())
    first, again, other, paths = infos
    assert (again.exact_step_rows, again.exact_batching) == \
        (first.exact_step_rows, first.exact_batching) == (8, True)
    assert "recalled" not in logs[0] and f"recalled from {exactness_cache}" in logs[1]
    assert "recalled" not in logs[2] and (other.exact_step_rows, other.exact_batching) == (8, True)
    assert "recalled" not in logs[3] and (paths.exact_step_rows, paths.exact_batching) == (8, True)
