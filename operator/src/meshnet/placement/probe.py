"""Measuring the links between a route's machines: a probe agent on each machine, and the
measurement that asks each agent to time its link to every other.

The agent speaks one JSON line per request on TCP: `echo` (answered at once: round trips),
`sink` (N bytes follow, answered once all arrived: bandwidth) and `measure` (the agent
times its own link to another agent with those two and answers the figures). A token,
when the agent has one, must come with every request: an agent dials whatever `measure`
names, so only callers that hold the route's token may make it."""

from __future__ import annotations

import hmac
import io
import json
import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshnet.placement.order import Links, MeasuredLink

CHUNK = 1 << 16
TIMEOUT_S = 60.0
MAX_SINK_BYTES = 1 << 30


class ProbeError(RuntimeError):
    """A probe agent refused a request or could not be reached."""


@dataclass(frozen=True)
class Probe:
    """How hard to measure each link."""

    rounds: int = 5  # echo round trips after a first that opens the path (median taken)
    nbytes: int = 8 << 20  # bytes sent to time the bandwidth
    token: str = ""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


class _Connection:
    """One request/answer connection to an agent."""

    def __init__(self, address: str, timeout: float = TIMEOUT_S) -> None:
        try:
            self.sock = socket.create_connection(split_address(address), timeout=timeout)
        except OSError as error:
            raise ProbeError(f"probe agent {address}: {error}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        self.address = address

    def ask(self, request: Mapping[str, object], payload: int = 0) -> dict[str, object]:
        try:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
            _send_zeros(self.sock, payload)
            line = self.reader.readline()
        except OSError as error:
            raise ProbeError(f"probe agent {self.address}: {error}") from None
        if not line:
            raise ProbeError(f"probe agent {self.address} closed the connection")
        answer: dict[str, object] = json.loads(line)
        if "error" in answer:
            raise ProbeError(f"probe agent {self.address}: {answer['error']}")
        return answer

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def _send_zeros(sock: socket.socket, nbytes: int) -> None:
    block = bytes(CHUNK)
    while nbytes > 0:
        sock.sendall(block[:min(nbytes, CHUNK)])
        nbytes -= CHUNK


def time_link(address: str, probe: Probe) -> MeasuredLink:
    """This machine's link to the agent at `address`: the median echo round trip, and the
    bytes/s of a sink of probe.nbytes (its time less one round trip, the answer's way back
    and the request's first byte's way there)."""
    connection = _Connection(address)
    try:
        request = {"token": probe.token}
        connection.ask({"op": "echo", **request})  # opens the path: not counted
        trips = []
        for _ in range(probe.rounds):
            start = time.perf_counter()
            connection.ask({"op": "echo", **request})
            trips.append(time.perf_counter() - start)
        rtt = statistics.median(trips)
        start = time.perf_counter()
        connection.ask({"op": "sink", "bytes": probe.nbytes, **request}, payload=probe.nbytes)
        elapsed = time.perf_counter() - start
    finally:
        connection.close()
    return MeasuredLink(rtt, probe.nbytes / max(elapsed - rtt, 1e-6))


def measure(agents: Mapping[str, str], probe: Probe,
            via: Mapping[tuple[str, str], str] | None = None,
            progress: Callable[[str, str, MeasuredLink], None] | None = None) -> Links:
    """Every directed link between the machines named in `agents` (name -> its agent's
    address), one at a time so that no two share a wire: agent `a` times its link to `b`
    at `via[a, b]` when given (the address `a` reaches `b` by), else at b's address."""
    links: dict[tuple[str, str], MeasuredLink] = {}
    for a, control in agents.items():
        for b, address in agents.items():
            if a == b:
                continue
            connection = _Connection(control)
            try:
                answer = connection.ask({"op": "measure", "to": (via or {}).get((a, b), address),
                                         "rounds": probe.rounds, "bytes": probe.nbytes,
                                         "token": probe.token})
            finally:
                connection.close()
            link = MeasuredLink(float(answer["rtt_s"]),  # type: ignore[arg-type]
                                float(answer["bytes_per_s"]))  # type: ignore[arg-type]
            links[a, b] = link
            if progress:
                progress(a, b, link)
    return links


class _Handler(socketserver.StreamRequestHandler):
    server: Agent

    def handle(self) -> None:
        while line := self.rfile.readline():
            try:
                answer = self.server.answer(json.loads(line), self.rfile)
            except (ValueError, ProbeError) as error:
                answer = {"error": str(error)}
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            self.wfile.flush()
            if "error" in answer:
                return


class Agent(socketserver.ThreadingTCPServer):
    """The probe agent of one machine (`meshnet links serve`)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: str, token: str = "") -> None:
        super().__init__(split_address(listen), _Handler)
        self.token = token

    @property
    def address(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"{host}:{port}"

    def answer(self, request: dict[str, object], payload: io.BufferedIOBase) -> dict[str, object]:
        if self.token and not hmac.compare_digest(str(request.get("token", "")), self.token):
            raise ProbeError("wrong or missing token")
        op = request.get("op")
        if op == "echo":
            return {"ok": True}
        if op == "sink":
            nbytes = _bounded(request.get("bytes"))
            while nbytes > 0:
                got = payload.read(min(nbytes, CHUNK))
                if not got:
                    raise ProbeError("the sink's bytes ended early")
                nbytes -= len(got)
            return {"ok": True}
        if op == "measure":
            rounds = request.get("rounds")
            if not isinstance(rounds, int) or not 1 <= rounds <= 100:
                raise ProbeError("rounds: 1 to 100")
            link = time_link(str(request.get("to")),
                             Probe(rounds, _bounded(request.get("bytes")), self.token))
            return {"rtt_s": link.rtt_s, "bytes_per_s": link.bytes_per_s}
        raise ProbeError(f"unknown op {op!r}: echo, sink or measure")

    def serve_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, daemon=True, name="probe-agent")
        thread.start()
        return thread


def _bounded(value: object) -> int:
    if not isinstance(value, int) or not 1 <= value <= MAX_SINK_BYTES:
        raise ProbeError(f"bytes: 1 to {MAX_SINK_BYTES}")
    return value
