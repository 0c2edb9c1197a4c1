"""A client of one shard worker: the ShardService stub plus the translation of gRPC
errors into StageError with the protocol's ErrorInfo reason."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from meshnet.route.errors import StageError
from meshnet.route.proto import pb, pb_grpc
from meshnet.route.route_key import RouteSecret
from meshnet.route.step_deadline import StepDeadline

ERROR_DOMAIN = "shard.meshnet.dev"
# Large enough for full-vocabulary logits of several rows; reconnect quickly to a
# restarted worker (gRPC's default backoff grows to minutes).
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
TOKENIZE_PATIENCE = 5.0  # seconds a Tokenize retries a stage whose tokenizers are all busy


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS: the CA that signed the workers, and for mTLS our cert + key;
    `server_name`: the name the workers' certificate is checked against instead of the
    address dialled (a pod IP is in no certificate)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca),
            private_key=read(self.key),
            certificate_chain=read(self.cert),
        )


def stage_error(endpoint: str, error: grpc.RpcError) -> StageError:
    """The StageError for a failed call, with the ErrorInfo reason when there is one."""
    code = error.code().name if hasattr(error, "code") else "UNKNOWN"
    message = error.details() if hasattr(error, "details") else str(error)
    reason, metadata = "", {}
    status = rpc_status.from_call(error) if hasattr(error, "trailing_metadata") else None
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                reason, metadata = info.reason, dict(info.metadata)
    return StageError(endpoint, code, reason, message or "", metadata)


def frozen(endpoint: str, seconds: float) -> StageError:
    return StageError(
        endpoint, "DEADLINE_EXCEEDED", "",
        f"no answer within {seconds:.0f} s, many times its recent steps: the stage is "
        "frozen or overloaded",
    )


class PendingForward:
    """A Forward in flight."""

    def __init__(self, endpoint: str, future: grpc.Future, steps: StepDeadline,
                 rows: int, seconds: float) -> None:
        self.endpoint = endpoint
        self._future = future
        self._steps, self._rows, self._seconds = steps, rows, seconds
        self._started = time.monotonic()

    def result(self) -> pb.ForwardResponse:
        try:
            response: pb.ForwardResponse = self._future.result()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # our own step deadline
                raise frozen(self.endpoint, self._seconds) from None
            raise stage_error(self.endpoint, exc) from None
        self._steps.observe(time.monotonic() - self._started, self._rows)
        return response


class _Watchdog:
    """One thread per stream that calls `expire(seconds)` when an armed deadline passes.
    Arming costs a lock, not a thread: a Timer per decoded token costs a thread start
    on the token's path."""

    def __init__(self, expire: Callable[[float], None]) -> None:
        self._expire = expire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._seconds = 0.0
        self._closed = False
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self, seconds: float) -> None:
        with self._cond:
            self._deadline, self._seconds = time.monotonic() + seconds, seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self._expire(self._seconds)


class ForwardStreamCall:
    """A ForwardStream carrying one request (a decode loop): iterate the responses
    (StageError on failure); `cancel()` stops the loop and releases the session there.

    A watchdog gives each answer the stage's step deadline (the first one has the
    request's rows, the loop's later steps one each); the consumer's own time between
    answers does not count."""

    def __init__(self, endpoint: str, call: grpc.Call, steps: StepDeadline,
                 rows: int) -> None:
        self.endpoint = endpoint
        self._call = call
        self._steps, self._rows = steps, rows
        self._expired_after = 0.0

    def __iter__(self) -> Iterator[pb.ForwardResponse]:
        responses = iter(self._call)
        rows = self._rows
        watchdog = _Watchdog(self._expire)
        try:
            while True:
                watchdog.arm(self._steps.seconds(rows))
                started = time.monotonic()
                try:
                    response = next(responses)
                except StopIteration:
                    return
                except grpc.RpcError as exc:
                    if self._expired_after:
                        raise frozen(self.endpoint, self._expired_after) from None
                    raise stage_error(self.endpoint, exc) from None
                finally:
                    watchdog.disarm()
                self._steps.observe(time.monotonic() - started, rows)
                rows = 1
                yield response.forward
        finally:
            watchdog.close()

    def _expire(self, seconds: float) -> None:
        self._expired_after = seconds
        self._call.cancel()

    def cancel(self) -> None:
        self._call.cancel()


class StageClient:
    """One worker endpoint ("host:port"). Thread-safe; calls raise StageError.

    Steps (Forward, ForwardStream answers) get a deadline from this stage's measured
    step times (`steps`); the other calls get `timeout`."""

    def __init__(self, endpoint: str, tls: TlsFiles | None = None, timeout: float = 120.0,
                 steps: StepDeadline | None = None, route_key: RouteSecret | None = None) -> None:
        self.endpoint = endpoint
        # Every call proves the route key when we hold one (a stage with a key serves the
        # calls that run or end a session only so; the others ignore it).
        self._metadata = route_key.metadata() if route_key else None
        self.timeout = timeout
        self.steps = steps or StepDeadline()
        if tls is not None:
            self._channel = grpc.secure_channel(endpoint, tls.credentials(),
                                                [*CHANNEL_OPTIONS, *tls.options()])
        else:
            self._channel = grpc.insecure_channel(endpoint, CHANNEL_OPTIONS)
        self._stub = pb_grpc.ShardServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: object, timeout: float | None = None) -> object:
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               metadata=self._metadata)
        except grpc.RpcError as exc:
            raise stage_error(self.endpoint, exc) from None

    def info(self, timeout: float | None = None) -> pb.GetInfoResponse:
        return self._call("GetInfo", pb.GetInfoRequest(), timeout)  # type: ignore[return-value]

    def capacity(self) -> pb.GetCapacityResponse:
        return self._call("GetCapacity", pb.GetCapacityRequest())  # type: ignore[return-value]

    def forward(self, request: pb.ForwardRequest) -> pb.ForwardResponse:
        return self.forward_async(request).result()

    def forward_async(self, request: pb.ForwardRequest) -> PendingForward:
        """Starts a Forward; `.result()` waits for it (raising StageError)."""
        rows = len(request.positions)
        seconds = self.steps.seconds(rows)
        future = self._stub.Forward.future(request, timeout=seconds, metadata=self._metadata)
        return PendingForward(self.endpoint, future, self.steps, rows, seconds)

    def forward_stream(self, request: pb.ForwardRequest) -> ForwardStreamCall:
        """ForwardStream with this one request, then a half-close."""
        call = self._stub.ForwardStream(iter([pb.ForwardStreamRequest(forward=request)]),
                                        timeout=None, metadata=self._metadata)
        return ForwardStreamCall(self.endpoint, call, self.steps, len(request.positions))

    def release(self, key: pb.RouteKey, timeout: float | None = None) -> bool:
        response = self._call("ReleaseSession", pb.ReleaseSessionRequest(key=key), timeout)
        return bool(response.released)  # type: ignore[attr-defined]

    def release_future(self, key: pb.RouteKey, timeout: float) -> grpc.Future:
        """Starts a ReleaseSession (its future raises grpc.RpcError on failure); raises
        ValueError when this client was closed."""
        return self._stub.ReleaseSession.future(pb.ReleaseSessionRequest(key=key),
                                                timeout=timeout, metadata=self._metadata)

    def tokenize(self, text: str, add_special: bool = True,
                 literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """The text's tokens; no control token is made from the UTF-8 byte ranges in
        `literal` (a chat's message content). A stage whose few tokenizer threads are all
        busy refuses at once ("retry shortly"): retried with growing pauses for up to
        TOKENIZE_PATIENCE seconds, so a burst of sessions queues here rather than failing."""
        request = pb.TokenizeRequest(
            text=text, add_special=add_special,
            literal=[pb.TextRange(begin=begin, end=end) for begin, end in literal])
        give_up, pause = time.monotonic() + TOKENIZE_PATIENCE, 0.005
        while True:
            try:
                response = self._call("Tokenize", request)
                return list(response.tokens)  # type: ignore[attr-defined]
            except StageError as exc:
                if exc.reason != "CAPACITY_EXHAUSTED" or time.monotonic() + pause > give_up:
                    raise
            time.sleep(pause * random.uniform(0.5, 1.5))  # jitter: the burst spreads out
            pause = min(pause * 2, 0.2)

    def detokenize(self, tokens: Sequence[int]) -> str:
        response = self._call("Detokenize", pb.DetokenizeRequest(tokens=list(tokens)))
        return str(response.text)  # type: ignore[attr-defined]
