"""The route key: only holders of the route's secret run, read or end its sessions (see
"Route key" in shard_service.proto). Each test is an attack a stranger who reaches a
stage's port (a pod in the cluster, a process on the host) made on main: subscribing to
the ring with the route id and epoch GetInfo gives, opening the local relay with the
token GetInfo gave, holding many subscriptions, and running or releasing another user's
session. Against a real 2-stage ring of SmolLM2 on 127.0.0.1, whose own session decodes
the unsplit model's tokens meanwhile."""

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
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, RouteRefused, StageClient, StageError
from meshnet.route.proto import pb, pb_grpc
from meshnet.route.route_key import ROUTE_AUTH_METADATA, RouteSecret
from meshnet.route.stage import stage_error

from .conftest import closed_within

ROUTE = "test/route-key"
PROMPT = "A lighthouse keeper counts the ships that pass at night, and"
SERVICE = "/meshnet.shard.v1.ShardService/"


@pytest.fixture(scope="module")
def ring(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id=ROUTE, threads=1)
             for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("route-key"), ring=True)
    yield workers
    for worker in workers:
        worker.stop()


def key_of(workers: list[WorkerProcess]) -> RouteSecret:
    key = route_key_of(workers)
    assert key is not None, "start_route gives a ring a route key"
    return key


def metric(worker: WorkerProcess, pattern: str) -> float:
    """The sum of the worker's metric lines matching `pattern` (a regex over the line)."""
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if re.match(pattern, line))


def ring_tokens_fed(first: WorkerProcess) -> float:
    """Decode-loop steps the first stage started from a token the ring brought."""
    return metric(first, r'meshnet_shard_requests_total\{.*rpc="Ring".*code="OK"')


def ring_refusals(last: WorkerProcess, code: str) -> float:
    return metric(last, rf'meshnet_shard_requests_total\{{.*rpc="Ring".*code="{code}"')


def local_batches(worker: WorkerProcess) -> float:
    return metric(worker, r'meshnet_shard_relay_batches_total\{transport="local"\}')


def strangers_ring(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] | None,
                   timeout: float | None = 30.0) -> grpc.Call:
    """A Ring subscription for the route and epoch GetInfo names, as a stranger asks it
    (one that is not refused ends at `timeout`, having heard what it heard)."""
    stub = pb_grpc.ShardServiceStub(channel)  # type: ignore[no-untyped-call]
    info = stub.GetInfo(pb.GetInfoRequest(), timeout=5)
    request = pb.RingRequest(key=pb.RouteKey(route_id=info.route_id, epoch=info.epoch))
    return stub.Ring(request, metadata=metadata, timeout=timeout)  # type: ignore[no-any-return]


def drain(call: grpc.Call) -> tuple[list[pb.RingResponse], grpc.RpcError | None]:
    """What a subscription received, and how it ended."""
    heard: list[pb.RingResponse] = []
    try:
        for message in call:  # type: ignore[attr-defined]
            heard.append(message)
    except grpc.RpcError as ended:
        return heard, ended
    return heard, None


def test_a_stranger_is_refused_the_ring_and_hears_no_token_while_a_session_decodes(
    ring: list[WorkerProcess], reference: Callable[..., list[int]],
) -> None:
    first, last = ring
    wrong = RouteSecret.generate().metadata()  # a key of another route
    fed_before = ring_tokens_fed(first)
    with grpc.insecure_channel(last.endpoint) as channel:
        strangers = [strangers_ring(channel, None), strangers_ring(channel, wrong)]
        with RouteDriver([w.endpoint for w in ring], route_key=key_of(ring),
                         topology="ring") as driver:
            assert driver.connect(wait=30).ringed
            prompt = driver.tokenize(PROMPT)
            deadline = time.monotonic() + 15  # the first stage moves to the local relay
            while local_batches(last) == 0:
                assert time.monotonic() < deadline, "the chain never used the local relay"
                driver.generate(prompt, max_tokens=4, stop_at_eos=False)
            relayed_before = local_batches(last)
            generation = driver.generate(prompt, max_tokens=24, stop_at_eos=False)
        heard = [drain(call) for call in strangers]
    assert generation.tokens == reference(prompt, 24)
    assert (generation.topology, generation.decode_loop) == ("ring", True)
    assert local_batches(last) - relayed_before >= 24  # the chain ran on the local relay
    assert ring_tokens_fed(first) > fed_before  # the route's own subscription served it
    (missing, no_key), (mismatch, wrong_key) = heard
    assert missing == [] and mismatch == []  # not even the hello, let alone a token
    # refused and counted, where an operator sees it
    assert ring_refusals(last, "UNAUTHENTICATED") >= 1
    assert ring_refusals(last, "PERMISSION_DENIED") >= 1
    assert no_key is not None and no_key.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stage_error(last.endpoint, no_key).reason == "ROUTE_KEY_MISSING"
    assert wrong_key is not None and wrong_key.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stage_error(last.endpoint, wrong_key).reason == "ROUTE_KEY_MISMATCH"


def test_getinfo_hands_out_no_local_relay_token_and_only_the_keys_token_opens_it(
    ring: list[WorkerProcess],
) -> None:
    last = ring[1]
    with grpc.insecure_channel(last.endpoint) as channel:
        raw = channel.unary_unary(SERVICE + "GetInfo", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)(b"", timeout=5)
    info = pb.GetInfoResponse.FromString(raw)
    known = pb.GetInfoResponse.FromString(raw)
    known.DiscardUnknownFields()
    # Nothing beyond the known fields (field 25, the old token, is reserved).
    assert len(known.SerializeToString()) == len(raw)
    assert "local_relay_token" not in pb.GetInfoResponse.DESCRIPTOR.fields_by_name
    assert info.local_relay_port > 0 and info.requires_route_key
    key = key_of(ring)
    # A step of another epoch: answered (refused, never run) once the connection is open.
    step = pb.RelayRequest(batch_id=3, steps=[pb.ForwardRequest(
        key=pb.RouteKey(route_id=ROUTE, epoch=99, session_id="probe"),
        n_past=0, positions=[0], tokens=[1])]).SerializeToString()
    frame = struct.pack("<I", len(step)) + step
    strangers = (bytes(32), RouteSecret.generate().local_relay_token(info.incarnation),
                 key.local_relay_token("another-incarnation"), key.proof().encode()[:32])
    for opening in strangers:
        with socket.create_connection(("127.0.0.1", info.local_relay_port), timeout=10) as sock:
            sock.sendall(opening + frame)
            assert closed_within(sock, 5), opening
    with socket.create_connection(("127.0.0.1", info.local_relay_port), timeout=10) as sock:
        sock.sendall(key.local_relay_token(info.incarnation) + frame)
        sock.settimeout(10)
        header = sock.recv(4, socket.MSG_WAITALL)
        answer = pb.RelayResponse.FromString(
            sock.recv(struct.unpack("<I", header)[0], socket.MSG_WAITALL))
    assert answer.batch_id == 3
    assert answer.results[0].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]


def test_one_subscriber_past_the_cap_is_refused_and_idle_ones_stall_no_session(
    ring: list[WorkerProcess], reference: Callable[..., list[int]],
) -> None:
    """The first stage holds one of the last stage's 4 (--ring-subscribers' default); three
    more holders of the key subscribe and never read again; a fifth is refused."""
    last = ring[1]
    proof = key_of(ring).metadata()
    with grpc.insecure_channel(last.endpoint) as channel:
        idle = [strangers_ring(channel, proof, timeout=None) for _ in range(3)]
        for call in idle:
            assert next(call).incarnation  # type: ignore[call-overload]  # subscribed
        extra = strangers_ring(channel, proof)
        heard, refused = drain(extra)
        with RouteDriver([w.endpoint for w in ring], route_key=key_of(ring),
                         topology="ring") as driver:
            prompt = driver.tokenize(PROMPT)
            generation = driver.generate(prompt, max_tokens=24, stop_at_eos=False)
        for call in idle:
            call.cancel()
    assert heard == [] and refused is not None
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    error = stage_error(last.endpoint, refused)
    assert error.reason == "CAPACITY_EXHAUSTED" and error.metadata["max_ring_subscribers"] == "4"
    assert generation.tokens == reference(prompt, 24)
    assert generation.topology == "ring"


def prefill(session: str) -> pb.ForwardRequest:
    """A 4-token prefill of the route at its first stage, sampled at the last."""
    return pb.ForwardRequest(key=pb.RouteKey(route_id=ROUTE, epoch=1, session_id=session),
                             n_past=0, positions=[0, 1, 2, 3], tokens=[504, 3458, 282, 253],
                             relay=True, output=pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED,
                                                                 rows=[3]))


def next_step(session: str, token: int) -> pb.ForwardRequest:
    return pb.ForwardRequest(key=pb.RouteKey(route_id=ROUTE, epoch=1, session_id=session),
                             n_past=4, positions=[4], tokens=[token], relay=True,
                             output=pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED, rows=[0]))


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(StageError) as refused:
        call()
    return refused.value.reason


def test_a_stranger_can_neither_run_nor_release_a_live_session(
    ring: list[WorkerProcess],
) -> None:
    key = key_of(ring)
    first = ring[0]
    owner = StageClient(first.endpoint, route_key=key)
    token = owner.forward(prefill("victim")).sampled_tokens[0]
    victim = prefill("victim").key
    for stage in ring:  # each stage's port, with no key and with another route's
        for stranger, reason in ((StageClient(stage.endpoint), "ROUTE_KEY_MISSING"),
                                 (StageClient(stage.endpoint, route_key=RouteSecret.generate()),
                                  "ROUTE_KEY_MISMATCH")):
            assert refusal(lambda s=stranger: s.release(victim)) == reason
            assert refusal(lambda s=stranger: s.forward(next_step("victim", token))) == reason
            stranger.close()
    # The streams that run steps refuse the stranger as they open.
    with grpc.insecure_channel(first.endpoint) as channel:
        stub = pb_grpc.ShardServiceStub(channel)  # type: ignore[no-untyped-call]
        for method, message in (("ForwardStream", pb.ForwardStreamRequest(
                                     forward=next_step("victim", token))),
                                ("Relay", pb.RelayRequest(batch_id=1, steps=[
                                     next_step("victim", token)]))):
            with pytest.raises(grpc.RpcError) as refused:
                list(getattr(stub, method)(iter([message]), timeout=10))
            assert stage_error(first.endpoint, refused.value).reason == "ROUTE_KEY_MISSING"
    # The driver says what is missing rather than failing on its first step.
    with pytest.raises(RouteRefused, match="route-key-file"):
        RouteDriver([w.endpoint for w in ring]).connect()
    # The owner's session is whole: its next step builds on the 4 positions it prefilled.
    assert owner.forward(next_step("victim", token)).n_past == 5
    assert owner.release(victim)
    owner.close()


def test_a_worker_without_a_route_key_offers_no_ring_and_no_local_relay(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    spec = LaunchSpec(model=smollm2, layers=LayerRange(15, 30), route_id=ROUTE, threads=1,
                      slots=1, ctx=64)
    with WorkerProcess(shard_worker, spec, tmp_path / "keyless.log").start() as worker, \
            grpc.insecure_channel(worker.endpoint) as channel:
        info = pb_grpc.ShardServiceStub(channel).GetInfo(  # type: ignore[no-untyped-call]
            pb.GetInfoRequest(), timeout=5)
        heard, refused = drain(strangers_ring(channel, ((ROUTE_AUTH_METADATA, "x"),)))
    assert not info.requires_route_key and info.local_relay_port == 0
    assert heard == [] and refused is not None
    assert stage_error(worker.endpoint, refused).reason == "RING_UNAVAILABLE"
