"""Carries a plan out against the cluster: children created/patched/deleted with the
operator's field manager, events with fixed reasons, status patched only on change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from meshnet.api import shardroute
from meshnet.api.common import API_VERSION
from meshnet.operator.expectations import Expectations
from meshnet.operator.kube import KubeClient, path
from meshnet.reconcile import Create, Delete, Patch, Plan
from meshnet.reconcile.planner import STATUS_KEYS

# kind -> (apiVersion, plural) of the children a plan may touch
RESOURCES = {"Pod": ("v1", "pods"), "Service": ("v1", "services"),
             "Deployment": ("apps/v1", "deployments")}


async def execute(client: KubeClient, route: Mapping[str, Any], result: Plan,
                  expectations: Expectations) -> None:
    """Apply the plan's actions in order, then post its events, then its status."""
    namespace, name = route["metadata"]["namespace"], route["metadata"]["name"]
    key = (namespace, name)
    for action in result.actions:
        if isinstance(action, Create):
            kind = action.obj["kind"]
            created = await client.create(path(*RESOURCES[kind], namespace), action.obj)
            if created is not None and kind == "Pod":
                expectations.created(key, created)
        elif isinstance(action, Patch):
            await client.patch(path(*RESOURCES[action.kind], namespace, action.name),
                               action.body)
        elif isinstance(action, Delete):
            # Expected before the call: the watch may report it gone before it returns,
            # and the first of several pods gone is news only once the others are too.
            if action.kind == "Pod":
                expectations.deleted(key, action.name)
            try:
                await client.delete(path(*RESOURCES[action.kind], namespace, action.name))
            except Exception:
                if action.kind == "Pod":
                    expectations.undeleted(key, action.name)
                raise
    owner = kopf.Body(cast(kopf.RawBody, dict(route)))
    for event in result.events:
        kopf.event(owner, type=event.type, reason=event.reason, message=event.message)
    if result.status is not None:
        await client.patch(route_path(namespace, name, "status"),
                           {"status": status_patch(result.status)})


def status_patch(status: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch owning every status key we write: absent keys are removed (None)."""
    return {key: status.get(key) for key in STATUS_KEYS}


def route_path(namespace: str, name: str, sub: str = "") -> str:
    return path(API_VERSION, shardroute.PLURAL, namespace, name, sub)
