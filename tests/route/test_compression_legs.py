"""The driver's side of boundary compression, without workers: which legs it packs (the
setting, what the stage takes, never loopback but under the test switch), and its packing,
which the workers unpack (tests/route/test_boundary_compression.py), refusing what does not
come back whole."""

from __future__ import annotations

import numpy as np
import pytest

from meshnet.route.compression import (
    TEST_LOOPBACK_SWITCH,
    BoundaryCompression,
    BoundaryUnpackError,
    leg_encoding,
    packed,
    raw_data,
)
from meshnet.route.proto import pb

OFF, LZ4 = BoundaryCompression.OFF, BoundaryCompression.SHUFFLE_LZ4
RAW, SHUFFLE = pb.BOUNDARY_ENCODING_UNSPECIFIED, pb.BOUNDARY_ENCODING_SHUFFLE_LZ4
TAKES_IT = (RAW, SHUFFLE)


def boundary(dtype: int = pb.BOUNDARY_DTYPE_F32, rows: int = 3) -> pb.Boundary:
    # few significant bits, as the byte planes find in real residuals (normal noise with every
    # mantissa bit random would not compress: LZ4 may then grow it by a few bytes)
    values = np.round(np.random.default_rng(5).normal(0.0, 0.5, rows * 576) * 64) / 64
    values[:3] = (0.0, -0.0, 1e-42)  # signed zero and a denormal must survive bit for bit
    data = values.astype(np.float32 if dtype == pb.BOUNDARY_DTYPE_F32 else np.float16).tobytes()
    return pb.Boundary(schema=pb.BOUNDARY_SCHEMA_DENSE_RESIDUAL, dtype=dtype,
                       shape=[rows, 576], data=data)


@pytest.mark.parametrize(("compression", "endpoint", "accepted", "switch", "expected"), [
    (LZ4, "10.0.0.7:50051", TAKES_IT, None, SHUFFLE),
    (OFF, "10.0.0.7:50051", TAKES_IT, None, RAW),  # not asked for
    (LZ4, "10.0.0.7:50051", (), None, RAW),  # a worker older than encodings
    (LZ4, "10.0.0.7:50051", (RAW,), None, RAW),
    (LZ4, "127.0.0.1:7001", TAKES_IT, None, RAW),  # loopback: never
    (LZ4, "localhost:7001", TAKES_IT, None, RAW),
    (LZ4, "[::1]:7001", TAKES_IT, None, RAW),
    (LZ4, "unix:/run/stage.sock", TAKES_IT, None, RAW),
    (LZ4, "127.0.0.1:7001", TAKES_IT, "1", SHUFFLE),  # the test switch lifts the rule
    (LZ4, "127.0.0.1:7001", TAKES_IT, "yes", RAW),  # and only as "1"
    (OFF, "127.0.0.1:7001", TAKES_IT, "1", RAW),  # it never turns compression on
])
def test_a_leg_is_packed_only_when_asked_taken_and_off_loopback(
    compression: BoundaryCompression, endpoint: str, accepted: tuple[int, ...],
    switch: str | None, expected: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if switch is None:
        monkeypatch.delenv(TEST_LOOPBACK_SWITCH, raising=False)
    else:
        monkeypatch.setenv(TEST_LOOPBACK_SWITCH, switch)
    assert leg_encoding(compression, endpoint, accepted) == expected


@pytest.mark.parametrize("dtype", [pb.BOUNDARY_DTYPE_F32, pb.BOUNDARY_DTYPE_F16])
def test_a_packed_boundary_unpacks_to_its_bytes_and_is_smaller(dtype: int) -> None:
    plain = boundary(dtype)
    sent = packed(plain, SHUFFLE)
    assert (sent.encoding, sent.raw_size) == (SHUFFLE, len(plain.data))
    assert len(sent.data) < len(plain.data)
    assert list(sent.shape) == list(plain.shape)
    assert raw_data(sent) == plain.data
    assert packed(sent, SHUFFLE) is sent  # passed on as it came, never unpacked
    assert packed(sent, RAW) == plain


def test_a_packed_boundary_that_does_not_come_back_whole_is_refused() -> None:
    sent = packed(boundary(), SHUFFLE)
    wrong_crc, truncated, oversized, huge = (pb.Boundary() for _ in range(4))
    for copy in (wrong_crc, truncated, oversized, huge):
        copy.CopyFrom(sent)
    wrong_crc.raw_crc32 ^= 1
    truncated.data = sent.data[:-5]
    oversized.raw_size += 4
    huge.raw_size = 0xFFFFFFFF  # refused by its shape, never allocated
    for bad in (wrong_crc, truncated, oversized, huge):
        with pytest.raises(BoundaryUnpackError):
            raw_data(bad)
