"""Thin kopf handlers: every trigger of a ShardRoute (create, update, resume, timer,
delete, a child pod's event, its artifact's event) runs the same level-based reconcile."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import kopf

from meshnet.api import GROUP, VERSION, labels, modelartifact, shardroute
from meshnet.operator.context import Context
from meshnet.operator.drain_watch import idle_pipelines
from meshnet.operator.executor import execute, owner_path
from meshnet.operator.expectations import Expectations
from meshnet.operator.identity import IDENTITY_LABEL, ensure_identity, indexed, operator_tls
from meshnet.operator.registration import on_every_trigger, run_reconcile
from meshnet.reconcile.route import (
    STATUS_KEYS,
    Observed,
    gateway_rolled_out,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    plan,
    replica_of,
)
from meshnet.reconcile.route.placement import (
    ObservedProbes,
    observe_agent,
    observe_measurement,
)
from meshnet.reconcile.route.probespec import NODES_KEY, PLACEMENT_ROUTE
from meshnet.timestamps import utc_now

ROUTES = (GROUP, VERSION, shardroute.PLURAL)
ARTIFACTS = (GROUP, VERSION, modelartifact.PLURAL)
OURS: dict[str, Any] = {
    labels.ROUTE: kopf.PRESENT, labels.MANAGED_BY: labels.OPERATOR_NAME}
IDENTITIES: dict[str, Any] = {IDENTITY_LABEL: "route", **OURS}
PROBES: dict[str, Any] = {
    PLACEMENT_ROUTE: kopf.PRESENT, labels.MANAGED_BY: labels.OPERATOR_NAME}
GATEWAYS: dict[str, Any] = {
    labels.GATEWAY: kopf.PRESENT, labels.MANAGED_BY: labels.OPERATOR_NAME}
# Handlers take a `labels` kwarg, which would shadow the module inside them.
ROUTE_LABEL = labels.ROUTE
GATEWAY_LABEL = labels.GATEWAY
TEMPLATE_LABEL = labels.TEMPLATE
# A route's pods turn ready (or go) within moments of each other: one reconcile for all.
POD_EVENT_DELAY_SECONDS = 0.5


async def reconcile(ctx: Context, namespace: str, name: str, indices: dict[str, Any],
                    delay: float = 0.0) -> None:
    """observe -> plan -> execute for one route."""
    async def once() -> None:
        await _reconcile_once(ctx, namespace, name, indices)

    await run_reconcile(ctx, shardroute.KIND, (namespace, name), once, delay)


async def _reconcile_once(ctx: Context, namespace: str, name: str,
                          indices: dict[str, Any]) -> None:
    key = (namespace, name)
    body = await ctx.client.get(owner_path(shardroute.PLURAL, namespace, name))  # the epoch
    if body is None:
        ctx.metrics.route_conditions(key, None)
        ctx.metrics.status.route(key, None)
        ctx.expectations.forget(key)
        return
    observed = _observe(body, indices, ctx.expectations)
    tls = None
    if not observed.route.deleting and observed.route.spec is not None:
        found = next(iter(indices["route_identities"].get(key, ())), None)
        identity, files = await ensure_identity(ctx.client, observed.route, found, utc_now())
        observed = dataclasses.replace(observed, identity=identity)
        tls = operator_tls(namespace, name, observed.route.spec, files)
    if observed.gateway_rolled_out or observed.gateway_deployment_hash is None:
        # (while a gateway rolls out, its old pod may still send a draining pipeline new
        # sessions: no need to ask)
        idle = await idle_pipelines(observed.pods, ctx.settings.worker_grpc_port, tls=tls)
        observed = dataclasses.replace(observed, idle_pipelines=idle)
    result = plan(observed, ctx.settings.worker_config(), utc_now(),
                  ctx.settings.placement_config())
    await execute(ctx.client, body, shardroute.PLURAL, result, STATUS_KEYS, ctx.expectations)
    if result.requeue_after is not None:
        ctx.wake_later(key, result.requeue_after,
                       lambda: reconcile(ctx, namespace, name, indices))
    ctx.metrics.epoch_advances.inc(int(result.epoch_advanced))
    gone = observed.route.deleting
    ctx.metrics.route_conditions(key, None if gone else result.conditions)
    ctx.metrics.status.route(key, None if gone else result.status or body.get("status") or {})


def _observe(body: dict[str, Any], indices: dict[str, Any],
             expectations: Expectations) -> Observed:
    route = observe_route(body)
    key = (route.namespace, route.name)
    indexed = tuple(p for p in indices["route_pods"].get(key, ()) if p is not None)
    pods = expectations.apply(key, indexed)
    services = dict(indices["route_services"].get(key, ()))  # (replica, template hash)
    artifact = None
    if route.spec is not None:
        found = indices["artifacts"].get((route.namespace, route.spec.artifact_ref.name), ())
        artifact = next(iter(found), None)
    deployment = next(iter(indices["gateway_deployments"].get(key, ())), None)
    return Observed(route, pods, services=services, artifact=artifact,
                    probes=_probes(indices, key),
                    gateway_deployment_hash=deployment[0] if deployment else None,
                    gateway_rolled_out=deployment[1] if deployment else False,
                    gateway_service_hash=next(iter(indices["gateway_services"].get(key, ())), None),
                    network_policy_hash=next(iter(indices["route_policies"].get(key, ())), None))


def _probes(indices: dict[str, Any], key: tuple[str, str]) -> ObservedProbes:
    """The route's probe agents, measuring Jobs (with their pods) and token Secret."""
    pods = list(indices["placement_pods"].get(key, ()))
    agents = tuple(observe_agent(p) for p in pods if NODES_KEY not in p["metadata"]["labels"])
    jobs = tuple(observe_measurement(job, [p for p in pods if p["metadata"]["labels"].get(
        "job-name") == job["metadata"]["name"]]) for job in indices["placement_jobs"].get(
        key, ()))
    token = next(iter(indices["placement_tokens"].get(key, ())), None)
    return ObservedProbes(agents, jobs, token, secrets.token_urlsafe(32))


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register every handler on `registry`, bound to `ctx` (no module-level state)."""

    @kopf.index("pods", labels=OURS, id="route_pods", registry=registry)
    async def route_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                         **_: Any) -> Any:
        return {(namespace, labels[ROUTE_LABEL]): observe_pod(body)}

    @kopf.index("services", labels=OURS, id="route_services", registry=registry)
    async def route_services(namespace: str | None, labels: kopf.Labels, **_: Any) -> Any:
        return {(namespace, labels[ROUTE_LABEL]): (replica_of(labels),
                                                   labels.get(TEMPLATE_LABEL, ""))}

    @kopf.index("secrets", labels=IDENTITIES, id="route_identities", registry=registry)
    async def route_identities(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                               **_: Any) -> Any:
        return {(namespace, labels[ROUTE_LABEL]): indexed(body)}

    @kopf.index("networkpolicies", labels=OURS, id="route_policies", registry=registry)
    async def route_policies(namespace: str | None, labels: kopf.Labels, **_: Any) -> Any:
        return {(namespace, labels[ROUTE_LABEL]): labels.get(TEMPLATE_LABEL, "")}

    @kopf.index("deployments", labels=GATEWAYS, id="gateway_deployments", registry=registry)
    async def gateway_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                                  **_: Any) -> Any:
        return {(namespace, labels[GATEWAY_LABEL]): (labels.get(TEMPLATE_LABEL, ""),
                                                     gateway_rolled_out(body))}

    @kopf.index("services", labels=GATEWAYS, id="gateway_services", registry=registry)
    async def gateway_services(namespace: str | None, labels: kopf.Labels, **_: Any) -> Any:
        return {(namespace, labels[GATEWAY_LABEL]): labels.get(TEMPLATE_LABEL, "")}

    @kopf.index("pods", labels=PROBES, id="placement_pods", registry=registry)
    async def placement_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                             **_: Any) -> Any:
        return {(namespace, labels[PLACEMENT_ROUTE]): {
            "metadata": {k: dict(body["metadata"].get(k) or {}) for k in ("labels",
                                                                           "annotations")}
            | {"name": body["metadata"]["name"]}, "status": dict(body.get("status") or {})}}

    @kopf.index("batch", "v1", "jobs", labels=PROBES, id="placement_jobs", registry=registry)
    async def placement_jobs(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                             **_: Any) -> Any:
        return {(namespace, labels[PLACEMENT_ROUTE]): {
            "metadata": {"name": body["metadata"]["name"], "labels": dict(labels)},
            "status": dict(body.get("status") or {})}}

    @kopf.index("secrets", labels=PROBES, id="placement_tokens", registry=registry)
    async def placement_tokens(namespace: str | None, name: str, labels: kopf.Labels,
                               **_: Any) -> Any:
        return {(namespace, labels[PLACEMENT_ROUTE]): name}

    @kopf.on.event("pods", labels=PROBES, registry=registry)
    @kopf.on.event("batch", "v1", "jobs", labels=PROBES, registry=registry)
    async def probe_changed(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
        ctx.metrics.triggers.labels("placement").inc()
        await reconcile(ctx, namespace or "", labels[PLACEMENT_ROUTE], kwargs,
                        delay=POD_EVENT_DELAY_SECONDS)

    @kopf.index(*ARTIFACTS, id="artifacts", registry=registry)
    async def artifacts(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
        return {(namespace, name): observe_referenced_artifact(body)}

    @kopf.index(*ROUTES, id="routes_by_artifact", registry=registry)
    async def routes_by_artifact(namespace: str | None, name: str, spec: kopf.Spec,
                                 **_: Any) -> Any:
        return {(namespace, (spec.get("artifactRef") or {}).get("name")): name}

    @on_every_trigger(registry, ROUTES, ctx.settings.resync_seconds)
    async def route_changed(namespace: str | None, name: str, **kwargs: Any) -> None:
        ctx.metrics.triggers.labels(str(kwargs.get("reason") or "timer")).inc()
        await reconcile(ctx, namespace or "", name, kwargs)

    @kopf.on.event("pods", labels=OURS, registry=registry)
    async def pod_changed(namespace: str | None, labels: kopf.Labels, type: str | None,
                          body: kopf.Body, **kwargs: Any) -> None:
        key = (namespace or "", labels[ROUTE_LABEL])
        if type != "DELETED" and ctx.expectations.unchanged(key, body):
            ctx.metrics.triggers.labels("pod-unchanged").inc()
            return  # our own create, or a replay: the planner has seen this pod as it is
        if type == "DELETED" and ctx.expectations.gone(key, body["metadata"]["name"]):
            ctx.metrics.triggers.labels("pod-deleted-early").inc()
            return  # one of the old epoch's pods: the planner waits for the last one
        ctx.metrics.triggers.labels("pod").inc()
        await reconcile(ctx, *key, kwargs, delay=POD_EVENT_DELAY_SECONDS)

    seen_artifacts: dict[tuple[str | None, str], Any] = {}

    @kopf.on.event(*ARTIFACTS, registry=registry)
    async def artifact_changed(namespace: str | None, name: str, type: str | None,
                               body: kopf.Body, **kwargs: Any) -> None:
        observed = None if type == "DELETED" else observe_referenced_artifact(body)
        if seen_artifacts.get((namespace, name), False) == observed:
            ctx.metrics.triggers.labels("artifact-unchanged").inc()
            return  # a replay, or a change no route sees (e.g. a provisioning progress)
        seen_artifacts[(namespace, name)] = observed
        ctx.metrics.triggers.labels("artifact").inc()
        for route in set(kwargs["routes_by_artifact"].get((namespace, name), ())):
            await reconcile(ctx, namespace or "", route, kwargs)

