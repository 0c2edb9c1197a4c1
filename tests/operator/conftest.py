"""Factories of ModelArtifact / ShardRoute bodies shared by the operator tests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from meshnet.api.modelartifact import ModelArtifactSpec

MakeArtifact = Callable[..., dict[str, Any]]
MakeRoute = Callable[..., dict[str, Any]]


def artifact_body(name: str = "smollm2", *, block_count: int = 30, ready: bool = True,
                  namespace: str = "default", host_path: bool = False) -> dict[str, Any]:
    files = [{"name": f"model-0000{i}-of-00002.gguf", "size": 1000 + i,
              "sha256": hashlib.sha256(f"{name}{i}".encode()).hexdigest()} for i in (1, 2)]
    storage = ({"hostPath": {"path": "/var/lib/meshnet/models/smollm2"}} if host_path
               else {"pvc": {"claimName": "models", "subPath": name}})
    spec = {"files": files, "source": {"http": {"baseURL": "https://models.example/smollm2"}},
            "storage": storage,
            "expectations": {"architecture": "llama", "blockCount": block_count}}
    status: dict[str, Any] = {}
    if ready:
        status = {"manifestDigest": ModelArtifactSpec.model_validate(spec).manifest_digest(),
                  "gguf": {"architecture": "llama", "blockCount": block_count},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "Verified",
                                  "message": "all files verified"}]}
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": spec, "status": status}


THREE_STAGES = ((0, 10), (10, 20), (20, 30))


def route_body(name: str = "r1", *, ranges: Sequence[tuple[int, int]] = THREE_STAGES,
               artifact: str = "smollm2", namespace: str = "default", generation: int = 1,
               recipe: dict[str, Any] | None = None, **spec_extra: Any) -> dict[str, Any]:
    stages = [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
              for i, (b, e) in enumerate(ranges)]
    spec = {"artifactRef": {"name": artifact}, "recipe": recipe or {"lane": "cpu"},
            "stages": stages, **spec_extra}
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ShardRoute",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "generation": generation},
            "spec": spec}


@pytest.fixture
def make_artifact() -> MakeArtifact:
    return artifact_body


@pytest.fixture
def make_route() -> MakeRoute:
    return route_body
