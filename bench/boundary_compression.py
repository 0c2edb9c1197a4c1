"""Lossless compression of the boundary a stage sends down the chain: does it pay on any
link? Real activations (SmolLM2's first stage, and a tiny random-weight V4 at the real
width, n_embd 4096 x mHC 4) of a prompt's prefill rows, each row compressed on its own as
a link would send it, by general-purpose codecs with and without a byte-plane shuffle
(the 4 bytes of each f32 regrouped so the exponents sit together).

    .venv/bin/python bench/boundary_compression.py [--tokens 256] [--repeats 5]

Per codec: the ratio (raw bytes / compressed), the CPU time to compress and to
decompress one row (median of --repeats passes over every row, 1 thread), and the
break-even bandwidth: below it the bytes saved take longer on the wire than the codec
takes on both ends (saved bits / (compress + decompress time)); the profiles' bandwidths
are printed beside it (meshnet.devtools.link_model).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lz4.block
import numpy as np
import zstandard

from meshnet._proto.meshnet.shard.v1 import shard_service_pb2 as pb
from meshnet.api.shardroute import LayerRange
from meshnet.bundled import smollm2_gguf
from meshnet.devtools.link_model import PROFILES, format_rate
from meshnet.devtools.tiny_deepseek4 import V4_WIDTH, write_tiny_deepseek4
from meshnet.local.process import LaunchSpec, start_route, worker_binary
from meshnet.route.stage import StageClient

TEXT = ("The harbour at dawn was quiet. Fishing boats rocked against the pier while the "
        "first gulls circled over the market, where traders unloaded crates of lemons, "
        "olives and salted fish. ")


def shuffle(row: bytes) -> bytes:
    """Byte planes: every value's byte 0, then every byte 1, ... (lossless, invertible)."""
    return np.frombuffer(row, dtype=np.uint8).reshape(-1, 4).T.tobytes()


def unshuffle(data: bytes) -> bytes:
    return np.frombuffer(data, dtype=np.uint8).reshape(4, -1).T.tobytes()


@dataclass(frozen=True)
class Codec:
    name: str
    compress: Callable[[bytes], bytes]
    decompress: Callable[[bytes, int], bytes]


def codecs() -> list[Codec]:
    zc1, zc3 = zstandard.ZstdCompressor(level=1), zstandard.ZstdCompressor(level=3)
    zd = zstandard.ZstdDecompressor()
    plain = [
        Codec("lz4", lambda b: lz4.block.compress(b, store_size=False),
              lambda b, n: lz4.block.decompress(b, uncompressed_size=n)),
        Codec("zstd-1", zc1.compress, lambda b, n: zd.decompress(b, max_output_size=n)),
        Codec("zstd-3", zc3.compress, lambda b, n: zd.decompress(b, max_output_size=n)),
        Codec("zlib-1", lambda b: zlib.compress(b, 1), lambda b, n: zlib.decompress(b)),
    ]

    def shuffled(codec: Codec) -> Codec:
        return Codec(f"shuffle+{codec.name}", lambda b: codec.compress(shuffle(b)),
                     lambda b, n: unshuffle(codec.decompress(b, n)))

    return plain + [shuffled(c) for c in plain]


def boundary_rows(model: Path, layers: LayerRange, tokens: int, logs: Path) -> list[bytes]:
    """The rows a first stage over `layers` sends for a prompt of `tokens` tokens."""
    logs.mkdir(parents=True, exist_ok=True)
    (worker,) = start_route(worker_binary(), [LaunchSpec(model=model, layers=layers,
                                                         threads=2, ctx=1024)], logs)
    client = StageClient(worker.endpoint)
    try:
        info = client.info()
        ids = client.tokenize(TEXT * (1 + tokens * 6 // len(TEXT)))[:tokens]
        rows: list[bytes] = []
        step = min(64, info.max_step_tokens)
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            answer = client.forward(pb.ForwardRequest(
                key=pb.RouteKey(route_id=info.route_id, epoch=info.epoch, session_id="z"),
                n_past=start, positions=list(range(start, start + len(chunk))), tokens=chunk,
                output=pb.OutputRequest(kind=pb.OUTPUT_KIND_BOUNDARY)))
            if answer.boundary.dtype != pb.BOUNDARY_DTYPE_F32:
                raise SystemExit("expected an f32 boundary")
            width = len(answer.boundary.data) // len(chunk)
            rows += [answer.boundary.data[i * width:(i + 1) * width] for i in range(len(chunk))]
        return rows
    finally:
        client.close()
        worker.stop()


def timed(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, rows: list[bytes], repeats: int) -> None:
    raw = sum(map(len, rows))
    print(f"\n{name}: {len(rows)} rows of {len(rows[0])} bytes")
    print(f"{'codec':<18}{'ratio':>7}{'compress':>12}{'decompress':>12}{'break-even':>16}")
    for codec in codecs():
        packed = [codec.compress(r) for r in rows]
        if [codec.decompress(p, len(r)) for p, r in zip(packed, rows, strict=True)] != rows:
            raise SystemExit(f"{codec.name} is not lossless")
        ratio = raw / sum(map(len, packed))
        enc = timed(lambda c=codec: [c.compress(r) for r in rows], repeats) / len(rows)
        dec = timed(lambda c=codec, p=packed: [c.decompress(x, len(r)) for x, r in
                                               zip(p, rows, strict=True)], repeats) / len(rows)
        saved_bits = (len(rows[0]) - len(rows[0]) / ratio) * 8
        even = saved_bits / (enc + dec) if saved_bits > 0 else 0.0
        print(f"{codec.name:<18}{ratio:7.3f}{enc * 1e6:10.1f}us{dec * 1e6:10.1f}us"
              f"{format_rate(even):>16}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="Prompt rows per model.")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="meshnet-compression-"))
    print("bandwidths of the link profiles: " + ", ".join(
        f"{p.name} {format_rate(p.link.bandwidth_bps)}" for p in PROFILES.values()
        if p.link.bandwidth_bps))
    smollm2 = boundary_rows(smollm2_gguf(), LayerRange(0, 15), options.tokens, logs / "s")
    measure("SmolLM2-135M, after layer 15", smollm2, options.repeats)
    v4 = write_tiny_deepseek4(logs / "v4-width.gguf", V4_WIDTH, seed=3)
    rows = boundary_rows(v4, LayerRange(0, 2), options.tokens, logs / "v4")
    measure("tiny V4 at the real width (random weights), after layer 2", rows, options.repeats)


if __name__ == "__main__":
    main()
