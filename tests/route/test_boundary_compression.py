"""Boundary compression per link (docs/protocol.md, "Boundary compression"): real workers on
loopback, SmolLM2 and a tiny deepseek4 model, give the same tokens over packed links as over
plain ones, on a relayed chain (the workers' --boundary-compression) and through the hub driver
(its legs), and their metrics show the packed bytes below the raw ones; a corrupted packed
boundary is refused with its typed reason.

Loopback is never compressed by rule, so these stages run with MESHNET_TEST_COMPRESS_LOOPBACK=1,
which only a worker listening on loopback (and the driver, only for loopback legs) honours."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import (
    BoundaryCompression,
    Generation,
    RouteDriver,
    Sampling,
    StageClient,
    StageError,
)
from meshnet.route.compression import TEST_LOOPBACK_SWITCH, packed
from meshnet.route.proto import pb

pytestmark = pytest.mark.slow

PROMPT = "The harbour master wrote down every ship that came in, and on the last night"
SEEDED = Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=1234)
COMPRESS = ("--boundary-compression", "shuffle-lz4")
ENCODED_BYTES = re.compile(
    r'^meshnet_shard_boundary_encoded_bytes_total\{direction="(\w+)",encoding="(\w+)",'
    r'kind="(\w+)"\} (\d+)$', re.M)


def boundary_bytes(worker: WorkerProcess) -> dict[tuple[str, str, str], int]:
    """The worker's boundary bytes by (direction, encoding, raw|wire)."""
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(way, encoding, kind): int(count)
            for way, encoding, kind, count in ENCODED_BYTES.findall(text)}


def decode_failures(worker: WorkerProcess) -> int:
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(r"^meshnet_shard_boundary_decode_failures_total (\d+)$", text, re.M)
    assert found, "no decode failure counter"
    return int(found.group(1))


# (model fixture, split, threads): deepseek4's CPU kernels are not thread-count invariant, so
# its stages run at one thread as its other tests do; SmolLM2 at one too (2 shared cores).
MODELS = {"smollm2": [(0, 15), (15, 30)], "deepseek4": [(0, 3), (3, 8)]}


@pytest.fixture(scope="module")
def tiny_deepseek4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-layer tiny deepseek4 (mHC boundary of 4 streams, hash-routed first layers)."""
    return write_tiny_deepseek4(tmp_path_factory.mktemp("ds4") / "small.gguf", SMALL, seed=1)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest, smollm2: Path, tiny_deepseek4: Path) -> tuple[str, Path]:
    return request.param, smollm2 if request.param == "smollm2" else tiny_deepseek4


def chain(shard_worker: Path, model: tuple[str, Path], logs: Path,
          extra: tuple[str, ...]) -> list[WorkerProcess]:
    """Two chained stages relaying over gRPC (the transport a link between hosts has)."""
    name, path = model
    specs = [LaunchSpec(model=path, layers=LayerRange(*span), route_id=f"test/compress-{name}",
                        threads=1, ctx=1024, local_relay=False, extra=extra)
             for span in MODELS[name]]
    return start_route(shard_worker, specs, logs, chain=True,
                       env={TEST_LOOPBACK_SWITCH: "1"})


@pytest.fixture(scope="module")
def plain_chain(shard_worker: Path, model: tuple[str, Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    workers = chain(shard_worker, model, tmp_path_factory.mktemp("plain"), ())
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def packed_chain(shard_worker: Path, model: tuple[str, Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """Stages relaying packed boundaries, once the first has asked the second (GetInfo, from
    its link's watchdog, just after it starts) that it takes them."""
    workers = chain(shard_worker, model, tmp_path_factory.mktemp("packed"), COMPRESS)
    deadline = time.monotonic() + 15
    while boundary_bytes(workers[1])["in", "shuffle_lz4", "raw"] == 0:
        assert time.monotonic() < deadline, "the first stage never packed a boundary"
        generate(workers, "chain", Sampling(), max_tokens=2)
        time.sleep(0.2)
    yield workers
    for worker in workers:
        worker.stop()


def generate(workers: list[WorkerProcess], topology: str, sampling: Sampling,
             compression: BoundaryCompression = BoundaryCompression.OFF,
             max_tokens: int = 12) -> Generation:
    with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers),
                     topology=topology, boundary_compression=compression) as driver:
        driver.connect(wait=10.0)
        generation = driver.generate(PROMPT, max_tokens=max_tokens, sampling=sampling,
                                     stop_at_eos=False)
    assert generation.topology == topology
    return generation


@pytest.mark.parametrize("sampling", [Sampling(), SEEDED], ids=["greedy", "seeded"])
def test_a_packed_chain_gives_the_plain_chains_tokens_and_sends_fewer_bytes(
    plain_chain: list[WorkerProcess], packed_chain: list[WorkerProcess], sampling: Sampling,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TEST_LOOPBACK_SWITCH, "1")
    before = boundary_bytes(packed_chain[1])
    assert (generate(packed_chain, "chain", sampling).tokens
            == generate(plain_chain, "chain", sampling).tokens)
    after = boundary_bytes(packed_chain[1])
    raw = after["in", "shuffle_lz4", "raw"] - before["in", "shuffle_lz4", "raw"]
    wire = after["in", "shuffle_lz4", "wire"] - before["in", "shuffle_lz4", "wire"]
    assert 0 < wire < raw, f"packed boundaries: {wire} bytes on the link for {raw} raw"
    plain = boundary_bytes(plain_chain[1])
    assert plain["in", "shuffle_lz4", "raw"] == 0 and plain["in", "raw", "raw"] > 0


@pytest.mark.parametrize("sampling", [Sampling(), SEEDED], ids=["greedy", "seeded"])
def test_the_hub_drivers_packed_legs_give_the_plain_legs_tokens_and_send_fewer_bytes(
    plain_chain: list[WorkerProcess], sampling: Sampling, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TEST_LOOPBACK_SWITCH, "1")
    first, second = plain_chain
    before = boundary_bytes(first), boundary_bytes(second)
    packed_legs = generate(plain_chain, "hub", sampling, BoundaryCompression.SHUFFLE_LZ4)
    after = boundary_bytes(first), boundary_bytes(second)
    plain_legs = generate(plain_chain, "hub", sampling)
    assert packed_legs.tokens == plain_legs.tokens
    assert packed_legs.boundary_bytes == plain_legs.boundary_bytes > 0  # the values', raw
    for stage, way in ((0, "out"), (1, "in")):  # the first stage's answers, passed on as they came
        raw = after[stage][way, "shuffle_lz4", "raw"] - before[stage][way, "shuffle_lz4", "raw"]
        wire = after[stage][way, "shuffle_lz4", "wire"] - before[stage][way, "shuffle_lz4", "wire"]
        assert 0 < wire < raw, f"stage {stage} {way}: {wire} bytes on the link for {raw} raw"


def test_the_driver_leaves_loopback_legs_plain_without_the_test_switch(
    plain_chain: list[WorkerProcess], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TEST_LOOPBACK_SWITCH, raising=False)
    before = boundary_bytes(plain_chain[1])
    generate(plain_chain, "hub", Sampling(), BoundaryCompression.SHUFFLE_LZ4)
    after = boundary_bytes(plain_chain[1])
    assert after["in", "shuffle_lz4", "raw"] == before["in", "shuffle_lz4", "raw"]
    assert after["in", "raw", "raw"] > before["in", "raw", "raw"]


def test_a_corrupted_packed_boundary_is_refused_with_its_reason(
    plain_chain: list[WorkerProcess], model: tuple[str, Path],
) -> None:
    first, second = (StageClient(w.endpoint, route_key=route_key_of(plain_chain))
                     for w in plain_chain)
    info = first.info()
    key = pb.RouteKey(route_id=info.route_id, epoch=info.epoch, session_id="corrupt")
    tokens = first.tokenize(PROMPT)[:4]
    answer = first.forward(pb.ForwardRequest(
        key=key, n_past=0, positions=range(len(tokens)), tokens=tokens,
        answer_encoding=pb.BOUNDARY_ENCODING_SHUFFLE_LZ4))
    assert answer.boundary.encoding == pb.BOUNDARY_ENCODING_SHUFFLE_LZ4
    good = answer.boundary
    flipped = pb.Boundary()
    flipped.CopyFrom(good)
    flipped.data = bytes([good.data[0] ^ 0x01]) + good.data[1:]  # a literal or token byte
    wrong_crc = pb.Boundary()
    wrong_crc.CopyFrom(good)
    wrong_crc.raw_crc32 ^= 1
    truncated = pb.Boundary()
    truncated.CopyFrom(good)
    truncated.data = good.data[:-3]
    unknown = packed(good, pb.BOUNDARY_ENCODING_UNSPECIFIED)
    unknown.encoding = 7  # type: ignore[assignment]
    failures = decode_failures(plain_chain[1])
    for bad in (flipped, wrong_crc, truncated, unknown):
        with pytest.raises(StageError) as refused:
            second.forward(pb.ForwardRequest(
                key=key, n_past=0, positions=range(len(tokens)), tokens=tokens, boundary=bad))
        assert (refused.value.code, refused.value.reason) == (
            "INVALID_ARGUMENT", "INVALID_BOUNDARY_ENCODING")
    assert decode_failures(plain_chain[1]) == failures + 4
    # the session was left as it was: the good boundary still runs from position 0
    done = second.forward(pb.ForwardRequest(key=key, n_past=0, positions=range(len(tokens)),
                                            tokens=tokens, boundary=good))
    assert done.n_past == len(tokens)
    first.release(key)
    second.release(key)
