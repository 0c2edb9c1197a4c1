"""meshnet.route: drive a generation through an ordered pipeline of shard workers.

    with RouteDriver(["127.0.0.1:7001", "127.0.0.1:7002"]) as driver:
        generation = driver.generate("Hello", max_tokens=32)

The handshake (GetInfo on every stage) refuses inconsistent routes; CACHE_MISS,
EPOCH_MISMATCH and restarted workers are recovered by re-prefilling, with identical
output. Generated protobuf code comes from `python -m meshnet.route.codegen`; the names
below load lazily so that running the generator needs none of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshnet.route.compression import BoundaryCompression
    from meshnet.route.driver import RouteDriver
    from meshnet.route.errors import (
        PromptTooLong,
        RecoveryFailed,
        RouteError,
        RouteRefused,
        StageError,
    )
    from meshnet.route.generation import Generation
    from meshnet.route.handshake import RouteInfo, StageInfo, check_route
    from meshnet.route.sampling import Sampling
    from meshnet.route.stage import StageClient, TlsFiles

_EXPORTS = {
    "BoundaryCompression": "meshnet.route.compression",
    "Generation": "meshnet.route.generation",
    "RouteDriver": "meshnet.route.driver",
    "PromptTooLong": "meshnet.route.errors",
    "RecoveryFailed": "meshnet.route.errors",
    "RouteError": "meshnet.route.errors",
    "RouteRefused": "meshnet.route.errors",
    "StageError": "meshnet.route.errors",
    "RouteInfo": "meshnet.route.handshake",
    "StageInfo": "meshnet.route.handshake",
    "check_route": "meshnet.route.handshake",
    "Sampling": "meshnet.route.sampling",
    "StageClient": "meshnet.route.stage",
    "TlsFiles": "meshnet.route.stage",
}

__all__ = [
    "BoundaryCompression",
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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'meshnet.route' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
