"""The host's own floor for the hand-offs of one decoded token on a 2-stage loopback route.

    .venv/bin/python bench/hop_floor.py [--compute-ms 3.5] [--rounds 400]

Two processes take turns the way a route's two stages do while one session decodes:
each computes (spins) for --compute-ms, then sends a boundary-sized message over
loopback TCP and blocks until the other's comes back. There is no gRPC, no
serialisation and no service code, so what is left beyond the spinning is the price of
the two hand-offs themselves: waking a thread in the other process on a core that has
been idle meanwhile (in a VM, an idle virtual CPU). No transport over sockets between
two processes on this host hands a token over for less; route_bench.py prints it next to
the route's own time outside the engines.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

MESSAGE_BYTES = 576 * 4  # SmolLM2's boundary row: 576 floats (f32, the default dtype)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _receive(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the other side of the hop-floor probe closed early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _peer(port: int, compute_ms: float) -> None:
    """The second 'stage': answer every message after computing for compute_ms."""
    with _connect(port) as sock:
        while True:
            try:
                message = _receive(sock, MESSAGE_BYTES)
            except ConnectionError:
                return
            _spin(compute_ms / 1e3)
            sock.sendall(message)


def hop_floor_ms(compute_ms: float, rounds: int = 400) -> float:
    """Median milliseconds per token beyond the two sides' compute_ms each."""
    if compute_ms < 0 or rounds < 1:
        raise ValueError("compute_ms must be >= 0 and rounds >= 1")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        peer = subprocess.Popen([sys.executable, __file__, "--peer", str(port),
                                 "--compute-ms", str(compute_ms)])
        try:
            server.settimeout(30)
            sock, _ = server.accept()
            with sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                message = bytes(MESSAGE_BYTES)
                extra: list[float] = []
                for i in range(rounds + 20):  # the first 20 warm up
                    started = time.perf_counter()
                    _spin(compute_ms / 1e3)
                    sock.sendall(message)
                    _receive(sock, MESSAGE_BYTES)
                    if i >= 20:
                        extra.append(time.perf_counter() - started - 2 * compute_ms / 1e3)
        finally:
            try:
                peer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                peer.kill()
                raise
    return 1e3 * statistics.median(extra)


def grpc_hop_floor_ms(tool: str, compute_ms: float, threads: int, rounds: int = 100,
                      env: dict[str, str] | None = None) -> float:
    """The same turns over one gRPC Relay stream with the worker's thread structure
    (meshnet-grpc-hop, built with the worker): median milliseconds per token beyond
    the compute."""
    result = subprocess.run(
        [tool, "--compute-us", str(round(compute_ms * 1e3)), "--threads", str(threads),
         "--rounds", str(rounds)],
        capture_output=True, text=True, timeout=300, check=True, env=env)
    return float(json.loads(result.stdout)["median_us"]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-ms", type=float, default=3.5,
                        help="What each side computes per token (default 3.5: half of "
                             "SmolLM2's decode step on 2 threads here).")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--peer", type=int, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.peer is not None:
        _peer(options.peer, options.compute_ms)
        return
    floor = hop_floor_ms(options.compute_ms, options.rounds)
    print(f"hop floor: {floor:.3f} ms per token (two hand-offs between processes, "
          f"each side computing {options.compute_ms:.2f} ms)")


if __name__ == "__main__":
    main()
