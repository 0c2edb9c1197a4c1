"""What every child pod we create shares, for routes and artifacts alike (pure)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

RUN_AS = 65532  # the distroless "nonroot" user
# The restricted Pod Security Standard, for stage, gateway and provisioning pods alike.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def template_hash(obj: Mapping[str, Any]) -> str:
    """Short digest of a child's desired form: a changed hash means the child is replaced."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
