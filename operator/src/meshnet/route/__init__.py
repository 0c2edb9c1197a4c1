"""meshnet.route: drive a generation through an ordered pipeline of shard workers.

    with RouteDriver(["127.0.0.1:7001", "127.0.0.1:7002"]) as driver:
        generation = driver.generate("Hello", max_tokens=32)

The handshake (GetInfo on every stage) refuses inconsistent routes; CACHE_MISS,
EPOCH_MISMATCH and restarted workers are recovered by re-prefilling, with identical
output. Generated protobuf code comes from `python -m meshnet.route.codegen`.
"""

from meshnet.route.driver import Generation, RouteDriver
from meshnet.route.errors import (
    PromptTooLong,
    RecoveryFailed,
    RouteError,
    RouteRefused,
    StageError,
)
from meshnet.route.handshake import RouteInfo, StageInfo, check_route
from meshnet.route.sampling import Sampling
from meshnet.route.stage import StageClient, TlsFiles

__all__ = [
    "Generation",
    "PromptTooLong",
    "RecoveryFailed",
    "RouteDriver",
    "RouteError",
    "RouteInfo",
    "RouteRefused",
    "Sampling",
    "StageClient",
    "StageError",
    "StageInfo",
    "TlsFiles",
    "check_route",
]
