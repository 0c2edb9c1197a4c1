"""Carries a plan out against the cluster, for every resource we own and every writer of
its status (the reconcile, the Tracker daemon): each step with the operator's field
manager and its event once it took effect, then the plan's events, then the status as a
merge patch of the writer's keys, only when it changed, and conditional on the
resourceVersion where it changes conditions (each writer stamps only its own types)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import kopf

from meshnet.api import labels
from meshnet.api.common import API_VERSION
from meshnet.errors import KubeApiError
from meshnet.operator.expectations import Expectations
from meshnet.operator.kube import KubeClient, path
from meshnet.reconcile.plan import Action, Create, Event, Patch, Plan, merge_patch

# kind -> (apiVersion, plural) of the children a plan may touch; Node is cluster-scoped.
CHILDREN = {"Pod": ("v1", "pods"), "Service": ("v1", "services"),
            "Deployment": ("apps/v1", "deployments"), "Job": ("batch/v1", "jobs"),
            "ConfigMap": ("v1", "configmaps"), "Node": ("v1", "nodes"),
            "Secret": ("v1", "secrets"),
            "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies")}


STATUS_ATTEMPTS = 4  # conditional status writes redone after a concurrent writer's


def child_path(kind: str, namespace: str, name: str = "") -> str:
    if kind == "Node":
        return "/api/v1/nodes" + (f"/{name}" if name else "")
    api_version, plural = CHILDREN[kind]
    return path(api_version, plural, namespace, name)


def owner_path(plural: str, namespace: str, name: str, sub: str = "") -> str:
    """The path of one of our resources (ShardRoute, ModelArtifact), or of its `sub`."""
    return path(API_VERSION, plural, namespace, name, sub)


async def execute(client: KubeClient, owner: Mapping[str, Any], plural: str, result: Plan,
                  status_keys: Sequence[str], expectations: Expectations | None = None,
                  still_current: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
    """Apply `result` for `owner` (a resource of `plural`); `expectations` learns of the
    pods created and deleted, before the watch tells; a status write redone after a
    concurrent writer's is dropped when the fresh read fails `still_current` (what the
    plan rests on moved: the next pass plans anew)."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    body = kopf.Body(cast(kopf.RawBody, dict(owner)))
    for step in result.steps:
        done = await _apply(client, step.action, namespace, (namespace, name), expectations)
        if done and step.event is not None:
            _post(body, step.event)
    for event in result.events:
        _post(body, event)
    if result.status is not None:
        await _write_status(client, owner, plural, result, status_keys,
                            still_current or (lambda _: True))


async def _write_status(client: KubeClient, owner: Mapping[str, Any], plural: str,
                        result: Plan, status_keys: Sequence[str],
                        still_current: Callable[[Mapping[str, Any]], bool]) -> None:
    """The plan's status as a merge patch of our keys. Conditions are a list another
    controller writes too (the Tracker daemon's Certified): a patch that changes them is
    conditional on the resourceVersion it was computed from, and one refused as stale is
    redone against a fresh read with the plan's own condition types over its others."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    url = owner_path(plural, namespace, name, "status")
    current: Mapping[str, Any] | None = owner
    own = set(result.own_conditions)
    for _ in range(STATUS_ATTEMPTS):
        if current is None:
            return  # deleted meanwhile
        status = current.get("status") or {}
        wanted = with_others_conditions(result.status or {}, status, own)
        patch = merge_patch(status, wanted, status_keys)
        if not patch:
            return
        body: dict[str, Any] = {"status": patch}
        version = (current.get("metadata") or {}).get("resourceVersion")
        if "conditions" in patch and version:
            body["metadata"] = {"resourceVersion": version}
        try:
            await client.patch(url, body)
            return
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        current = await client.get(owner_path(plural, namespace, name))
        if current is not None and not still_current(current):
            return
    raise KubeApiError(409, f"{plural}/{name}: status kept changing under {STATUS_ATTEMPTS}"
                            " writes; the next reconcile writes it")


def with_others_conditions(wanted: Mapping[str, Any], current: Mapping[str, Any],
                           own: set[str]) -> dict[str, Any]:
    """`wanted` with its conditions of `own` types, and every other writer's as `current`
    has them now (not as the read the plan was made from had them). The list keeps
    `current`'s order, a new type of ours going last: every writer then writes the same
    order, and neither sees the other's write as a change to undo."""
    if "conditions" not in wanted:
        return dict(wanted)
    ours = {c.get("type"): c for c in wanted["conditions"] if c.get("type") in own}
    kept = [ours.pop(c.get("type")) if c.get("type") in own else dict(c)
            for c in current.get("conditions") or []
            if c.get("type") not in own or c.get("type") in ours]
    return {**wanted, "conditions": kept + list(ours.values())}


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
        annotations = (action.body.get("metadata") or {}).get("annotations") or {}
        if action.kind == "Pod" and expectations is not None \
                and (since := annotations.get(labels.DRAINING_ANNOTATION)):
            expectations.draining(key, action.name, since)
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
