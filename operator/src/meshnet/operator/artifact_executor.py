"""Carries a ModelArtifact plan out: children created/deleted and node labels patched with
the operator's field manager, each step's event posted once it took effect, then the
transition events, then status as a merge patch, only when it changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from meshnet.api import modelartifact
from meshnet.api.common import API_VERSION
from meshnet.operator.kube import KubeClient, path
from meshnet.reconcile.artifact_planner import ArtifactPlan, merge_patch
from meshnet.reconcile.planner import Create, Delete, Event, Patch

# kind -> (apiVersion, plural); Node is the only cluster-scoped one.
KINDS = {"Job": ("batch/v1", "jobs"), "ConfigMap": ("v1", "configmaps"), "Node": ("v1", "nodes")}


def _url(kind: str, namespace: str, name: str = "") -> str:
    if kind == "Node":
        return "/api/v1/nodes" + (f"/{name}" if name else "")
    api_version, plural = KINDS[kind]
    return path(api_version, plural, namespace, name)


async def execute_artifact(client: KubeClient, artifact: Mapping[str, Any],
                           result: ArtifactPlan) -> None:
    namespace, name = artifact["metadata"]["namespace"], artifact["metadata"]["name"]
    owner = kopf.Body(cast(kopf.RawBody, dict(artifact)))
    for step in result.steps:
        action = step.action
        if isinstance(action, Create):
            done = await client.create(_url(action.obj["kind"], namespace),
                                       action.obj) is not None
        elif isinstance(action, Patch):
            await client.patch(_url(action.kind, namespace, action.name), action.body)
            done = True
        elif isinstance(action, Delete):
            done = await client.delete(_url(action.kind, namespace, action.name))
        if done and step.event is not None:
            _post(owner, step.event)
    for event in result.events:
        _post(owner, event)
    if result.status is not None:
        patch = merge_patch(artifact.get("status") or {}, result.status)
        if patch:
            await client.patch(artifact_path(namespace, name, "status"), {"status": patch})


def _post(owner: kopf.Body, event: Event) -> None:
    kopf.event(owner, type=event.type, reason=event.reason, message=event.message)


def artifact_path(namespace: str, name: str, sub: str = "") -> str:
    return path(API_VERSION, modelartifact.PLURAL, namespace, name, sub)
