"""Boundary compression on the driver's own legs (docs/protocol.md, "Boundary compression"):
which encoding a leg carries, and packing/unpacking a Boundary as the workers do (the values'
bytes in byte planes, then one LZ4 block; the raw size and zlib's CRC-32 beside it).

A leg is packed only when the driver is told to (`--boundary-compression shuffle-lz4`), the
receiving stage lists the encoding in GetInfo, and the stage is not on loopback: compression
costs CPU on both ends and pays only on links slower than its break-even (about 400 Mbit/s at
DeepSeek V4's width). MESHNET_TEST_COMPRESS_LOOPBACK=1 lifts the loopback rule for tests; it
can only ever change a loopback leg, so it never turns on compression towards another host.
"""

from __future__ import annotations

import enum
import os
import zlib

import lz4.block
import numpy as np

from meshnet.route.errors import RouteError
from meshnet.route.proto import pb

# Lifts the loopback rule (tests only): see the module docstring.
TEST_LOOPBACK_SWITCH = "MESHNET_TEST_COMPRESS_LOOPBACK"


class BoundaryCompression(enum.StrEnum):
    """What a link does to boundaries (the worker's --boundary-compression words)."""

    OFF = "off"
    SHUFFLE_LZ4 = "shuffle-lz4"

    @property
    def encoding(self) -> pb.BoundaryEncoding:
        """The wire's BoundaryEncoding."""
        if self is BoundaryCompression.SHUFFLE_LZ4:
            return pb.BOUNDARY_ENCODING_SHUFFLE_LZ4
        return pb.BOUNDARY_ENCODING_UNSPECIFIED


class BoundaryUnpackError(RouteError):
    """A packed boundary does not come back to the raw size and CRC-32 its sender stated."""


def is_loopback(endpoint: str) -> bool:
    """The endpoint is on this host's loopback (or a Unix socket)."""
    return endpoint.startswith(("127.", "localhost:", "[::1]:", "unix:"))


def leg_encoding(compression: BoundaryCompression, endpoint: str,
                 accepted: tuple[int, ...]) -> pb.BoundaryEncoding:
    """The encoding the leg to (or from) the stage at `endpoint`, which takes `accepted`
    (GetInfo.boundary_encodings), carries under `compression`."""
    wanted = compression.encoding
    if wanted == pb.BOUNDARY_ENCODING_UNSPECIFIED or wanted not in accepted:
        return pb.BOUNDARY_ENCODING_UNSPECIFIED
    if is_loopback(endpoint) and os.environ.get(TEST_LOOPBACK_SWITCH) != "1":
        return pb.BOUNDARY_ENCODING_UNSPECIFIED
    return wanted


def _value_size(boundary: pb.Boundary) -> int:
    return 4 if boundary.dtype == pb.BOUNDARY_DTYPE_F32 else 2


def raw_size(boundary: pb.Boundary) -> int:
    """Bytes of `boundary`'s values, however it travels (what Generation.boundary_bytes
    counts; the stages' metrics count what the links carried)."""
    if boundary.encoding == pb.BOUNDARY_ENCODING_UNSPECIFIED:
        return len(boundary.data)
    return boundary.raw_size


def raw_data(boundary: pb.Boundary) -> bytes:
    """`boundary`'s raw value bytes, unpacked and checked when it is packed."""
    if boundary.encoding == pb.BOUNDARY_ENCODING_UNSPECIFIED:
        return boundary.data
    if boundary.encoding != pb.BOUNDARY_ENCODING_SHUFFLE_LZ4:
        raise BoundaryUnpackError(f"boundary encoding {boundary.encoding} is unknown here")
    size = _value_size(boundary)
    # the size the shape implies, checked before anything is allocated for the stated one
    if boundary.raw_size != size * int(np.prod(boundary.shape, dtype=np.int64)):
        raise BoundaryUnpackError("packed boundary's stated raw size is not what its shape holds")
    try:
        planes = lz4.block.decompress(boundary.data, uncompressed_size=boundary.raw_size)
    except lz4.block.LZ4BlockError as exc:
        raise BoundaryUnpackError(f"packed boundary does not decompress: {exc}") from exc
    if len(planes) != boundary.raw_size or len(planes) % size:
        raise BoundaryUnpackError("packed boundary's size is not its stated raw size")
    raw = np.frombuffer(planes, np.uint8).reshape(size, -1).T.tobytes()
    if zlib.crc32(raw) != boundary.raw_crc32:
        raise BoundaryUnpackError("packed boundary's CRC-32 does not match its raw bytes")
    return raw


def packed(boundary: pb.Boundary, encoding: pb.BoundaryEncoding) -> pb.Boundary:
    """`boundary` as a leg carrying `encoding` takes it: itself when it is in that encoding
    already (a packed answer goes on to the next stage as it came), else its raw bytes packed
    anew (or unpacked, for a raw leg)."""
    if boundary.encoding == encoding:
        return boundary
    raw = raw_data(boundary)
    out = pb.Boundary(schema=boundary.schema, dtype=boundary.dtype, shape=boundary.shape)
    if encoding == pb.BOUNDARY_ENCODING_UNSPECIFIED:
        out.data = raw
        return out
    size = _value_size(boundary)
    planes = np.frombuffer(raw, np.uint8).reshape(-1, size).T.tobytes()
    out.data = lz4.block.compress(planes, store_size=False)
    out.encoding = encoding
    out.raw_size = len(raw)
    out.raw_crc32 = zlib.crc32(raw)
    return out
