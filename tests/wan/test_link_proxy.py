"""The WAN bench's link proxy shapes a loopback connection like the profile says: its
bandwidth, delay, jitter and loss, without ever dropping or reordering a byte."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from meshnet.devtools.link_model import PROFILES, Direction, Link, parse_link
from meshnet.devtools.link_proxy import LinkProxy


@contextmanager
def sink() -> Iterator[tuple[int, list[tuple[float, bytes]]]]:
    """A TCP server that records (arrival time, bytes) of everything it reads."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[tuple[float, bytes]] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                received.append((time.monotonic(), data))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], received
    finally:
        thread.join(30)
        server.close()


def send_through(link: Link, chunks: list[bytes], pause: float = 0.0
                 ) -> tuple[list[float], list[tuple[float, bytes]]]:
    """Sends `chunks` through a proxy over `link`; the send times and what arrived."""
    sent: list[float] = []
    with sink() as (port, received):  # it ends once the proxy has passed on the last byte
        proxy = LinkProxy(port, link, seed=7)
        with socket.create_connection(("127.0.0.1", proxy.port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for chunk in chunks:
                sent.append(time.monotonic())
                conn.sendall(chunk)
                time.sleep(pause)
    proxy.stop()
    return sent, received


def test_bandwidth_is_the_profiles_within_ten_percent() -> None:
    # 4 MiB at 100 Mbit/s: 0.336 s on the wire, plus the one-way delay once
    link = Link(delay_s=0.005, bandwidth_bps=100e6)
    payload = random.Random(1).randbytes(4 << 20)
    sent, received = send_through(link, [payload[i:i + 65536]
                                         for i in range(0, len(payload), 65536)])
    assert b"".join(data for _, data in received) == payload
    seconds = received[-1][0] - sent[0] - link.delay_s
    rate = len(payload) * 8 / seconds
    assert rate == pytest.approx(100e6, rel=0.10), f"{rate / 1e6:.1f} Mbit/s"


def test_delay_jitter_and_order() -> None:
    link = Link(delay_s=0.020, jitter_s=0.010)
    chunks = [i.to_bytes(4, "little") * 64 for i in range(40)]
    sent, received = send_through(link, chunks, pause=0.002)
    data = b"".join(d for _, d in received)
    assert data == b"".join(chunks)  # every byte, in order
    # each chunk is late by the delay and at most the jitter (plus scheduling slack)
    arrival_of = {}
    offset = 0
    for at, piece in received:
        for _ in range(len(piece)):
            arrival_of.setdefault(offset // 256, at)
            offset += 1
    lateness = [arrival_of[i] - sent[i] for i in range(len(chunks))]
    assert min(lateness) >= link.delay_s - 0.001
    assert max(lateness) <= link.delay_s + link.jitter_s + 0.015


def test_loss_adds_a_retransmission_never_drops() -> None:
    link = Link(delay_s=0.005, loss=0.2)
    chunks = [bytes([i]) * 1000 for i in range(30)]
    sent, received = send_through(link, chunks, pause=0.03)
    assert b"".join(d for _, d in received) == b"".join(chunks)
    late = [at - s for s, (at, _) in zip(sent, received, strict=False)]
    # some chunks paid the probe timeout (2 x RTT, at least 10 ms), the rest only the delay
    assert max(late) >= link.delay_s + link.retransmit_s - 0.002
    assert min(late) < link.delay_s + 0.005


def test_direction_model_is_pure_arithmetic() -> None:
    direction = Direction(Link(delay_s=0.01, bandwidth_bps=8e6), random.Random(0))
    # 1 MB at 8 Mbit/s leaves in 1 s; a second MB queues behind it
    assert direction.arrival(0.0, 1_000_000) == pytest.approx(1.01)
    assert direction.queued_s(0.5) == pytest.approx(0.5)
    assert direction.arrival(0.5, 1_000_000) == pytest.approx(2.01)


def test_profiles_parse_with_overrides_and_refuse_nonsense() -> None:
    consumer = parse_link("consumer")
    assert consumer == PROFILES["consumer"].link
    assert consumer.bandwidth_bps == 100e6 and consumer.loss == 0.001
    tuned = parse_link("consumer:delay=40ms,bw=50M,loss=0.5%")
    assert (tuned.delay_s, tuned.bandwidth_bps, tuned.loss) == (0.04, 50e6, 0.005)
    for bad in ("moon", "consumer:speed=1", "consumer:bw=fast", "consumer:loss=150%"):
        with pytest.raises(ValueError):
            parse_link(bad)
