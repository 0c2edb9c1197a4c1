"""A daemon per ShardRoute, beside the reconcile and never in its way: every few seconds
it asks the stages for their capacity, runs the lane's certification Job when needed,
shows the outcome in status (Certified condition, certification, tracker) and reports
to the Tracker. A slow stage or a down Tracker delays only this route's daemon."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from meshnet.api import labels
from meshnet.api.certification import CertifiedLane
from meshnet.api.common import API_VERSION
from meshnet.api.modelartifact import PLURAL as ARTIFACTS
from meshnet.api.tracker import CapacityReport, Provider
from meshnet.certify import job as jobs
from meshnet.certify import lane as lanes
from meshnet.certify.decide import Decision, Observation, decide
from meshnet.errors import KubeApiError
from meshnet.operator.executor import route_path
from meshnet.operator.handlers import ROUTES, Context
from meshnet.operator.kube import path
from meshnet.reconcile.podspec import RouteRef
from meshnet.tracker import kubernetes as kube_inputs
from meshnet.tracker.client import TrackerClient
from meshnet.tracker.inputs import StageView
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.reporter import Reporting, step, withdraw
from meshnet.tracker.schedule import Cadence
from meshnet.tracker.settings import pin_facts

log = logging.getLogger(__name__)
NODE_TTL_SECONDS = 600.0  # GPU products change only when a node is relabelled


@dataclass
class Shared:
    """What every route's daemon shares."""

    ctx: Context
    reporting: Reporting
    nodes: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)
    cluster_id: str | None = None
    withdrawals: set[asyncio.Task[Any]] = field(default_factory=set)


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """The per-route daemon, and the client's cleanup, on the operator's registry."""
    settings = ctx.settings.tracker
    metrics = TrackerMetrics(ctx.metrics.registry)
    client = None
    if ctx.settings.tracker_url:
        client = TrackerClient(ctx.settings.tracker_url,
                               lambda: settings.token(ctx.settings.tracker_token),
                               policy=settings.retry, metrics=metrics)
    shared = Shared(ctx, Reporting(Provider(id=settings.provider_id, cluster="unknown"),
                                   pin_facts(), client, metrics,
                                   settings.stage_timeout_seconds))

    @kopf.daemon(*ROUTES, registry=registry, cancellation_timeout=30.0)
    async def report_route(namespace: str | None, name: str, stopped: kopf.DaemonStopped,
                           **_: Any) -> None:
        cadence = Cadence(every_seconds=settings.report_seconds)
        last: CapacityReport | None = None
        while not stopped:
            last = await _guarded(shared, namespace or "", name, cadence) or last
            await stopped.wait(settings.sample_seconds)
        deleted = stopped.reason and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED
        if deleted and last is not None:  # the route may be gone already: no fresh pass
            # Its own task: kopf may cancel this daemon at once when the route is gone.
            task = asyncio.create_task(withdraw(shared.reporting, cadence, last))
            shared.withdrawals.add(task)
            task.add_done_callback(shared.withdrawals.discard)
            await asyncio.shield(task)
        metrics.route_available((namespace or "", name), None)

    @kopf.on.cleanup(registry=registry)
    async def close_client(**_: Any) -> None:
        if shared.withdrawals:  # a deleted route's last word, unless the Tracker is down
            await asyncio.wait(shared.withdrawals, timeout=settings.retry.timeout_seconds)
        if client is not None:
            await client.close()


async def _guarded(shared: Shared, namespace: str, name: str,
                   cadence: Cadence) -> CapacityReport | None:
    """One pass; a failure is logged and retried on the next pass, never raised: kopf
    would back the daemon off and the route would go unreported."""
    try:
        return await _pass(shared, namespace, name, cadence)
    except Exception:
        log.exception("tracker report of %s/%s failed; retrying on the next pass",
                      namespace, name)
        return None


async def _pass(shared: Shared, namespace: str, name: str,
                cadence: Cadence) -> CapacityReport | None:
    client, settings = shared.ctx.client, shared.ctx.settings
    body = await client.get(route_path(namespace, name))
    spec = kube_inputs.route_spec(body) if body else None
    if body is None or spec is None:
        return None
    deleting = bool(body["metadata"].get("deletionTimestamp"))
    await _ensure_cluster_id(shared)
    status = body.get("status") or {}
    pods = kube_inputs.current_pods(await _list(shared, namespace, "pods", labels.ROUTE, name),
                                    name, int(status.get("epoch") or 0))
    node_labels = {n: await _node_labels(shared, n) for n in kube_inputs.node_names(pods)}
    lane = kube_inputs.lane(spec, body, pods, node_labels)
    artifact = await client.get(path(API_VERSION, ARTIFACTS, namespace, spec.artifact_ref.name))
    view = kube_inputs.route_view(body, spec, artifact)
    stages = kube_inputs.stage_views(spec, pods, settings.worker_grpc_port)
    decision = await _certification(shared, body, view.ready and not deleting, lane, pods, stages)
    state = lanes.state(lane, decision.certificate)
    report, delivery = await step(shared.reporting, cadence, view, stages, state)
    if delivery is not None and not delivery.ok:
        log.warning("report of %s/%s did not reach the Tracker after %d attempts: %s",
                    namespace, name, delivery.attempts, delivery.error)
    error = None if delivery is None or delivery.ok else delivery.error[:1024]
    if delivery is None and cadence.last_success is None and shared.reporting.client:
        error = (status.get("tracker") or {}).get("deliveryError")
    patch = kube_inputs.status_patch(body, decision.certificate, decision.condition, report,
                                     error, _now())
    if patch is not None and not deleting:
        try:
            await client.json_patch(route_path(namespace, name, "status"), patch)
        except KubeApiError as exc:
            if exc.status not in (404, 409, 422):  # the reconcile wrote first: next pass
                raise
    return report


async def _certification(shared: Shared, body: dict[str, Any], ready: bool,
                         lane: CertifiedLane | None, pods: dict[str, Any],
                         stages: list[StageView]) -> Decision:
    client, settings = shared.ctx.client, shared.ctx.settings.tracker
    meta = body["metadata"]
    namespace, name = meta.get("namespace", "default"), meta["name"]
    request = (meta.get("annotations") or {}).get(jobs.RECERTIFY) or None
    stored = kube_inputs.stored_certificate(body)
    job_name = jobs.job_name(name, lane, request) if lane else ""
    job = await client.get(path("batch/v1", "jobs", namespace, job_name)) if lane else None
    outcome = None
    if job is not None:
        job_pods = [p for p in await _list(shared, namespace, "pods", jobs.JOB_NAME_LABEL,
                                           job_name)]
        outcome = jobs.job_outcome(job, job_pods)
    seen = Observation(lane=lane, route_ready=ready, stored=stored, request=request,
                       job_exists=job is not None, outcome=outcome,
                       image=settings.certify_images.get(lane.backend) if lane else None,
                       job_name=job_name)
    decision = decide(seen)
    if decision.certificate is not None and decision.certificate != stored:
        shared.reporting.metrics.certifications.labels(
            "passed" if decision.certificate.passed else "failed").inc()
    endpoints = [s.endpoint for s in stages]
    if decision.create_job and lane is not None and all(endpoints) and pods:
        first = pods[stages[0].name] if stages[0].name in pods else next(iter(pods.values()))
        status = body.get("status") or {}
        manifest = jobs.certification_job(jobs.JobInputs(
            route=RouteRef(name, namespace, meta.get("uid", "")), lane=lane, stage_pod=first,
            endpoints=[str(e) for e in endpoints], image=seen.image or "",
            gates=settings.gates, route_digest=status.get("routeDigest"),
            epoch=int(status.get("epoch") or 0), request=request,
            deadline_seconds=settings.certify_deadline_seconds))
        await client.create(path("batch/v1", "jobs", namespace), manifest)
        kopf.event(kopf.Body(body), type="Normal", reason="CertificationStarted",  # type: ignore[arg-type]
                   message=f"Job {job_name} certifies lane {lane.describe()}")
    return decision


async def _list(shared: Shared, namespace: str, plural: str, label: str,
                value: str) -> list[dict[str, Any]]:
    """Objects carrying label=value (filtered here too: not every API filters)."""
    query = urllib.parse.urlencode({"labelSelector": f"{label}={value}"})
    found = await shared.ctx.client.get(f"{path('v1', plural, namespace)}?{query}") or {}
    return [item for item in found.get("items") or []
            if ((item.get("metadata") or {}).get("labels") or {}).get(label) == value]


async def _node_labels(shared: Shared, node: str) -> dict[str, str]:
    cached = shared.nodes.get(node)
    if cached and time.monotonic() - cached[0] < NODE_TTL_SECONDS:
        return cached[1]
    body = await shared.ctx.client.get(f"/api/v1/nodes/{node}") or {}
    found = dict((body.get("metadata") or {}).get("labels") or {})
    shared.nodes[node] = (time.monotonic(), found)
    return found


async def _ensure_cluster_id(shared: Shared) -> None:
    """MESHNET_CLUSTER_ID, else the kube-system namespace's uid (the usual cluster id)."""
    if shared.cluster_id is not None:
        return
    shared.cluster_id = shared.ctx.settings.tracker.cluster_id
    if not shared.cluster_id:
        try:
            body = await shared.ctx.client.get("/api/v1/namespaces/kube-system") or {}
        except KubeApiError:
            body = {}
        shared.cluster_id = (body.get("metadata") or {}).get("uid") or "unknown"
    shared.reporting.provider = shared.reporting.provider.model_copy(
        update={"cluster": shared.cluster_id})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
