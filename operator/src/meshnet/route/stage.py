"""A client of one shard worker: the ShardService stub plus the translation of gRPC
errors into StageError with the protocol's ErrorInfo reason."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from meshnet.route.errors import StageError
from meshnet.route.proto import pb, pb_grpc

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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS: the CA that signed the workers, and for mTLS our cert + key."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

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


class PendingForward:
    """A Forward in flight."""

    def __init__(self, endpoint: str, future: grpc.Future) -> None:
        self.endpoint = endpoint
        self._future = future

    def result(self) -> pb.ForwardResponse:
        try:
            response: pb.ForwardResponse = self._future.result()
        except grpc.RpcError as exc:
            raise stage_error(self.endpoint, exc) from None
        return response


class ForwardStreamCall:
    """A ForwardStream carrying one request (a decode loop): iterate the responses
    (StageError on failure); `cancel()` stops the loop and releases the session there."""

    def __init__(self, endpoint: str, call: grpc.Call) -> None:
        self.endpoint = endpoint
        self._call = call

    def __iter__(self) -> Iterator[pb.ForwardResponse]:
        try:
            for response in self._call:
                yield response.forward
        except grpc.RpcError as exc:
            raise stage_error(self.endpoint, exc) from None

    def cancel(self) -> None:
        self._call.cancel()


class StageClient:
    """One worker endpoint ("host:port"). Thread-safe; calls raise StageError."""

    def __init__(self, endpoint: str, tls: TlsFiles | None = None, timeout: float = 120.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        if tls is not None:
            self._channel = grpc.secure_channel(endpoint, tls.credentials(), CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(endpoint, CHANNEL_OPTIONS)
        self._stub = pb_grpc.ShardServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: object, timeout: float | None = None) -> object:
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise stage_error(self.endpoint, exc) from None

    def info(self, timeout: float | None = None) -> pb.GetInfoResponse:
        return self._call("GetInfo", pb.GetInfoRequest(), timeout)  # type: ignore[return-value]

    def capacity(self) -> pb.GetCapacityResponse:
        return self._call("GetCapacity", pb.GetCapacityRequest())  # type: ignore[return-value]

    def forward(self, request: pb.ForwardRequest) -> pb.ForwardResponse:
        return self._call("Forward", request)  # type: ignore[return-value]

    def forward_async(self, request: pb.ForwardRequest) -> PendingForward:
        """Starts a Forward; `.result()` waits for it (raising StageError)."""
        future = self._stub.Forward.future(request, timeout=self.timeout)
        return PendingForward(self.endpoint, future)

    def forward_stream(self, request: pb.ForwardRequest) -> ForwardStreamCall:
        """ForwardStream with this one request, then a half-close."""
        call = self._stub.ForwardStream(iter([pb.ForwardStreamRequest(forward=request)]),
                                        timeout=None)
        return ForwardStreamCall(self.endpoint, call)

    def release(self, key: pb.RouteKey, timeout: float | None = None) -> bool:
        response = self._call("ReleaseSession", pb.ReleaseSessionRequest(key=key), timeout)
        return bool(response.released)  # type: ignore[attr-defined]

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        response = self._call("Tokenize", pb.TokenizeRequest(text=text, add_special=add_special))
        return list(response.tokens)  # type: ignore[attr-defined]

    def detokenize(self, tokens: Sequence[int]) -> str:
        response = self._call("Detokenize", pb.DetokenizeRequest(tokens=list(tokens)))
        return str(response.text)  # type: ignore[attr-defined]
