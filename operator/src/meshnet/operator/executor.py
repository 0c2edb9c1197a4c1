"""Carries a plan out against the cluster, for every resource we own: each step with the
operator's field manager and its event once it took effect, then the plan's events,
then the status as a merge patch of the keys we own, only when it changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from meshnet.api.common import API_VERSION
from meshnet.operator.expectations import Expectations
from meshnet.operator.kube import KubeClient, path
from meshnet.reconcile.plan import Action, Create, Event, Patch, Plan, merge_patch

# kind -> (apiVersion, plural) of the children a plan may touch; Node is cluster-scoped.
CHILDREN = {"Pod": ("v1", "pods"), "Service": ("v1", "services"),
            "Deployment": ("apps/v1", "deployments"), "Job": ("batch/v1", "jobs"),
            "ConfigMap": ("v1", "configmaps"), "Node": ("v1", "nodes")}


def child_path(kind: str, namespace: str, name: str = "") -> str:
    if kind == "Node":
        return "/api/v1/nodes" + (f"/{name}" if name else "")
    api_version, plural = CHILDREN[kind]
    return path(api_version, plural, namespace, name)


def owner_path(plural: str, namespace: str, name: str, sub: str = "") -> str:
    """The path of one of our resources (ShardRoute, ModelArtifact), or of its `sub`."""
    return path(API_VERSION, plural, namespace, name, sub)


async def execute(client: KubeClient, owner: Mapping[str, Any], plural: str, result: Plan,
                  status_keys: Sequence[str], expectations: Expectations | None = None) -> None:
    """Apply `result` for `owner` (a resource of `plural`); `expectations` learns of the
    pods created and deleted, before the watch tells."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    body = kopf.Body(cast(kopf.RawBody, dict(owner)))
    for step in result.steps:
        done = await _apply(client, step.action, namespace, (namespace, name), expectations)
        if done and step.event is not None:
            _post(body, step.event)
    for event in result.events:
        _post(body, event)
    if result.status is not None:
        patch = merge_patch(owner.get("status") or {}, result.status, status_keys)
        if patch:
            await client.patch(owner_path(plural, namespace, name, "status"), {"status": patch})


async def _apply(client: KubeClient, action: Action, namespace: str, key: tuple[str, str],
                 expectations: Expectations | None) -> bool:
    """Whether the action took effect (a create that found the object there did not)."""
    if isinstance(action, Create):
        kind = action.obj["kind"]
        created = await client.create(child_path(kind, namespace), action.obj)
        if created is not None and kind == "Pod" and expectations is not None:
            expectations.created(key, created)
        return created is not None
    if isinstance(action, Patch):
        await client.patch(child_path(action.kind, namespace, action.name), action.body)
        return True
    watched = expectations if action.kind == "Pod" else None
    # Expected before the call: the watch may report it gone before it returns, and the
    # first of several pods gone is news only once the others are too.
    if watched is not None:
        watched.deleted(key, action.name)
    try:
        return await client.delete(child_path(action.kind, namespace, action.name))
    except Exception:
        if watched is not None:
            watched.undeleted(key, action.name)
        raise


def _post(owner: kopf.Body, event: Event) -> None:
    kopf.event(owner, type=event.type, reason=event.reason, message=event.message)
