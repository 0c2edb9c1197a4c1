"""The generated meshnet.shard.v1 modules (see meshnet.route.codegen), regenerated on
import when missing or older than proto/ and grpcio-tools is at hand."""

from __future__ import annotations

import sys

from meshnet.route import codegen

if not codegen.is_current():
    try:
        codegen.generate()
        print("meshnet: regenerated meshnet._proto from proto/", file=sys.stderr)
    except ImportError as exc:  # pragma: no cover - images generate at build time
        raise ImportError(
            "meshnet._proto is missing or stale: run `python -m meshnet.route.codegen`"
        ) from exc

from meshnet._proto.meshnet.shard.v1 import shard_service_pb2 as pb
from meshnet._proto.meshnet.shard.v1 import shard_service_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
