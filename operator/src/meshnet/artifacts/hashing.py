"""Streaming sha256 of local files, reporting bytes as they are read."""

from __future__ import annotations

import hashlib
from pathlib import Path

from meshnet.artifacts.progress import Meter, NullMeter

READ_BYTES = 4 << 20


def sha256_file(path: Path, meter: Meter | None = None) -> str:
    meter = meter or NullMeter()
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(READ_BYTES)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            meter.advance(count)
    return digest.hexdigest()
