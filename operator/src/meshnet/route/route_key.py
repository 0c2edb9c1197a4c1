"""The route key: a per-route secret (32 random bytes, hex in a file) given to the route's
stages (--route-key-file), its gateway/driver and certification. A stage with one serves
Forward, ForwardStream, Relay, ReleaseSession and Ring only to callers that prove it: the
call's `meshnet-route-auth` metadata is hex(HMAC-SHA256(key, "meshnet-route-auth-v1")), so the
key itself never travels. The local relay opens with HMAC-SHA256(key, "meshnet-local-relay-v1"
|| the stage's incarnation). See "Route key" in proto/meshnet/shard/v1/shard_service.proto."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.errors import MeshnetError

ROUTE_AUTH_METADATA = "meshnet-route-auth"
KEY_BYTES = 32


class RouteKeyError(MeshnetError):
    """A route key file that is missing or is not 64 hex digits."""


@dataclass(frozen=True)
class RouteSecret:
    """A route key (its raw bytes are never printed)."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) != KEY_BYTES:
            raise RouteKeyError(f"a route key is {KEY_BYTES} bytes, not {len(self.secret)}")

    @classmethod
    def generate(cls) -> RouteSecret:
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def load(cls, path: Path) -> RouteSecret:
        """The key in `path` (64 hex digits, surrounding whitespace ignored)."""
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise RouteKeyError(f"cannot read the route key file {path}: {exc.strerror}") from None
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(text) != 2 * KEY_BYTES or len(secret) != KEY_BYTES:
            raise RouteKeyError(f"route key file {path}: expected {2 * KEY_BYTES} hex digits "
                                "(32 random bytes, e.g. `openssl rand -hex 32`)")
        return cls(secret)

    def write(self, path: Path) -> Path:
        """Writes the key to `path` readable by its owner only (mode 0600, from creation)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.secret.hex() + "\n")
        os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
        return path

    def proof(self) -> str:
        """What a holder sends in the `meshnet-route-auth` metadata of each call."""
        return hmac.new(self.secret, b"meshnet-route-auth-v1", hashlib.sha256).hexdigest()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC call metadata proving the key."""
        return ((ROUTE_AUTH_METADATA, self.proof()),)

    def local_relay_token(self, incarnation: str) -> bytes:
        """What a connection to the local relay of the worker with `incarnation` opens with."""
        return hmac.new(self.secret, b"meshnet-local-relay-v1" + incarnation.encode(),
                        hashlib.sha256).digest()


def load_or_create(path: Path) -> RouteSecret:
    """The key in `path`, or a new one written there (mode 0600) when there is none."""
    if path.exists():
        return RouteSecret.load(path)
    key = RouteSecret.generate()
    key.write(path)
    return key
