"""API keys at the front door, as vLLM's `--api-key` and OpenAI take them: a request to
/v1/ carries `Authorization: Bearer KEY`, and KEY must be one of the lines of the keys file
(re-read when it changes, so a key is added or revoked without a restart). /health,
/ready and /metrics stay open: probes and scrapers hold no key.

Keys are compared in constant time (each key's digest against the given one's, every key
every time), and none is ever sent on: a stage sees only the key's cache salt, which keeps
one key's cached prefixes from every other key (unless the route shares them on purpose).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshnet.errors import MeshnetError

# How often the file's size and mtime are looked at (a revoked key stops within this).
RECHECK_SECONDS = 1.0
SALT_CONTEXT = b"meshnet cache salt of an API key\0"


class ApiKeysError(MeshnetError):
    """The keys file cannot be read, or holds no key."""


@dataclass(frozen=True)
class Caller:
    """Who a request with a valid key is: its cache salt (never the key itself)."""

    salt: str


def read_keys(path: Path) -> tuple[bytes, ...]:
    """One key per line; blank lines and lines starting with '#' are not keys."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeysError(f"cannot read the API keys file {path}: {exc}") from None
    keys = tuple(line.strip().encode() for line in lines
                 if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ApiKeysError(f"the API keys file {path} holds no key (one key per line)")
    return keys


def bearer(header: str | None) -> bytes | None:
    """The key of an `Authorization: Bearer KEY` header, else None."""
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    return key.strip().encode() if scheme.lower() == "bearer" and key.strip() else None


class ApiKeys:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._digests = self._load(read_keys(path))
        self._stamp = self._file_stamp()
        self._checked = clock()

    @staticmethod
    def _load(keys: tuple[bytes, ...]) -> tuple[tuple[bytes, str], ...]:
        return tuple((hashlib.sha256(k).digest(),
                      hashlib.sha256(SALT_CONTEXT + k).hexdigest()[:32]) for k in keys)

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def _refresh(self) -> None:
        """Re-reads a changed file; an unreadable or empty one keeps the keys in force
        (said on stderr): a half-written file must not open or close the door."""
        now = self._clock()
        if now - self._checked < RECHECK_SECONDS:
            return
        self._checked = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._digests = self._load(read_keys(self.path))
        except ApiKeysError as exc:
            print(f"meshnet serve: {exc}; the keys read before stay in force", file=sys.stderr)

    def caller(self, header: str | None) -> Caller | None:
        """The caller a request's Authorization header proves, or None."""
        given = bearer(header)
        with self._lock:
            self._refresh()
            digests = self._digests
        wanted = hashlib.sha256(given or b"").digest()
        found: str | None = None
        for digest, salt in digests:  # every key, every time: the time says nothing
            if hmac.compare_digest(digest, wanted) and given is not None:
                found = salt
        return Caller(found) if found is not None else None
