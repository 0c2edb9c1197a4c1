"""A daemon per ShardRoute, beside the reconcile and never in its way: every few seconds
(less often while nothing changes, see pace.py) it asks the stages for their capacity,
reports to the Tracker, and plans the pass (tracker/planner.py): the lane's certification
Job when needed, and status (its Certified condition, certification, tracker, and the
acceptance of the route's speculation), which the executor writes as it writes a
reconcile's plan. A slow stage or a down Tracker delays only this route's daemon.

Steady state costs the API server nothing: the route body is kopf's live copy, stage
pods, artifacts, certification Jobs and their pods come from indices fed by the watches,
node labels are cached; status is written only when it changed."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from meshnet.api import shardroute
from meshnet.api.certification import CertifiedLane
from meshnet.api.tracker import CapacityReport, Provider
from meshnet.certify import job as jobs
from meshnet.certify import lane as lanes
from meshnet.certify.decide import Decision, Observation, decide
from meshnet.errors import KubeApiError
from meshnet.operator.context import Context
from meshnet.operator.executor import execute, owner_path
from meshnet.operator.handlers import ARTIFACTS, OURS, ROUTE_LABEL, ROUTES
from meshnet.operator.identity import Found, operator_tls
from meshnet.operator.kube import path
from meshnet.operator.pace import Pace
from meshnet.reconcile.plan import Plan
from meshnet.reconcile.route.podspec import RouteRef
from meshnet.timestamps import utc_now
from meshnet.tracker import kubernetes as kube_inputs
from meshnet.tracker.acceptance import route_speculation
from meshnet.tracker.client import TrackerClient
from meshnet.tracker.collect import StageChannels
from meshnet.tracker.exactness import route_exactness
from meshnet.tracker.inputs import StageView
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.planner import STATUS_KEYS, Shown, plan_pass
from meshnet.tracker.reporter import Reporting, step, withdraw
from meshnet.tracker.schedule import Cadence
from meshnet.tracker.settings import pin_facts

log = logging.getLogger(__name__)
NODE_TTL_SECONDS = 600.0  # GPU products change only when a node is relabelled
CERTIFYING: dict[str, Any] = {jobs.CERTIFY_ROUTE: kopf.PRESENT}


@dataclass
class Shared:
    """What every route's daemon shares."""

    ctx: Context
    reporting: Reporting
    nodes: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)
    cluster_id: str | None = None
    changes: int = 0  # events of certification Jobs, their pods and artifacts, so far
    withdrawals: set[asyncio.Task[Any]] = field(default_factory=set)


@dataclass(frozen=True)
class Seen:
    """One pass's view of the cluster (copies: the live body moves under us)."""

    body: dict[str, Any]
    pods: list[dict[str, Any]]  # this route's stage pods, any epoch
    artifacts: dict[str, dict[str, Any]]  # by name, in the route's namespace
    jobs: Mapping[str, list[dict[str, Any]]]  # certification Jobs by name (0 or 1 each)
    job_pods: Mapping[str, list[dict[str, Any]]]  # certification pods by Job name
    identity: Found | None = None  # the route's identity Secret (the handlers' index)


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """The per-route daemon, its indices and the client's cleanup, on the registry."""
    settings = ctx.settings.tracker
    metrics = TrackerMetrics(ctx.metrics.registry)
    client = None
    if ctx.settings.tracker_url:
        client = TrackerClient(ctx.settings.tracker_url,
                               lambda: settings.token(ctx.settings.tracker_token),
                               policy=settings.retry, metrics=metrics)
    shared = Shared(ctx, Reporting(Provider(id=settings.provider_id, cluster="unknown"),
                                   pin_facts(), client, metrics,
                                   settings.stage_timeout_seconds,
                                   StageChannels(retry_seconds=settings.sample_seconds)))

    @kopf.index("pods", labels=OURS, id="tracker_stage_pods", registry=registry)
    async def stage_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                         **_: Any) -> Any:
        return {(namespace, labels[ROUTE_LABEL]): kube_inputs.pod_facts(body)}

    @kopf.index("batch", "v1", "jobs", labels=CERTIFYING, id="tracker_jobs", registry=registry)
    async def certification_jobs(namespace: str | None, name: str, status: kopf.Status,
                                 **_: Any) -> Any:
        shared.changes += 1
        return {(namespace, name): {"status": copy.deepcopy(dict(status))}}

    @kopf.index("pods", labels=CERTIFYING, id="tracker_job_pods", registry=registry)
    async def job_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                       **_: Any) -> Any:
        shared.changes += 1
        job = labels.get(jobs.JOB_NAME_LABEL) or labels.get("job-name")
        return {(namespace, job): kube_inputs.pod_facts(body)} if job else None

    @kopf.index(*ARTIFACTS, id="tracker_artifacts", registry=registry)
    async def artifacts(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> Any:
        shared.changes += 1
        return {namespace: {name: {"status": {"gguf": dict(status.get("gguf") or {})}}}}

    @kopf.daemon(*ROUTES, registry=registry, cancellation_timeout=30.0)
    async def report_route(namespace: str | None, name: str, body: kopf.Body,
                           stopped: kopf.DaemonStopped, **indices: Any) -> None:
        cadence = Cadence(every_seconds=settings.report_seconds)
        last: CapacityReport | None = None
        ns = namespace or ""
        snapshot = _Snapshot()
        # An unchanged report is re-sent every report_seconds: passes stay within that.
        pace = Pace(settings.sample_seconds,
                    max(settings.sample_seconds, settings.report_seconds - settings.sample_seconds))
        while not stopped:
            current = snapshot.body(body)
            pods = snapshot.pods(indices["tracker_stage_pods"].get((namespace, name), ()))
            inputs = (snapshot.copies, shared.changes)
            if pace.due(inputs, time.monotonic()):
                seen = Seen(
                    body=current, pods=pods,
                    artifacts={k: v for found in indices["tracker_artifacts"].get(namespace, ())
                               for k, v in found.items()},
                    jobs=_ByJob(indices["tracker_jobs"], namespace),
                    job_pods=_ByJob(indices["tracker_job_pods"], namespace),
                    identity=next(iter(indices["route_identities"].get((namespace, name), ())),
                                  None))
                passed = await _unless_stopped(stopped, _guarded(shared, ns, name, cadence,
                                                                 seen))
                if passed is None:
                    break  # stopped mid-pass: a deleted route's stages are going away
                report, outcome = passed
                last = report or last
                pace.passed(inputs, outcome, time.monotonic())
            await stopped.wait(settings.sample_seconds)
        deleted = stopped.reason and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED
        if deleted and last is not None:  # the route may be gone already: no fresh pass
            # Its own task: kopf may cancel this daemon at once when the route is gone.
            task = asyncio.create_task(withdraw(shared.reporting, cadence, last))
            shared.withdrawals.add(task)
            task.add_done_callback(shared.withdrawals.discard)
            await asyncio.shield(task)
        metrics.route_available((ns, name), None)

    @kopf.on.cleanup(registry=registry)
    async def close_client(**_: Any) -> None:
        if shared.withdrawals:  # a deleted route's last word, unless the Tracker is down
            await asyncio.wait(shared.withdrawals, timeout=settings.retry.timeout_seconds)
        if client is not None:
            await client.close()
        if shared.reporting.channels is not None:
            await shared.reporting.channels.close()


async def _unless_stopped(stopped: kopf.DaemonStopped,
                          work: Coroutine[Any, Any, Passed]) -> Passed | None:
    """`work`'s result, or None when the daemon is stopped first: a deleted route is
    withdrawn at once, not after a pass that waits on its departing stages' timeouts."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


class _Snapshot:
    """A daemon's copies of the live route and of its stage pods, made again only when
    they changed (a new resourceVersion, other objects in the index): hundreds of routes
    deep-copied every pass cost CPU while nothing changed. A pass only reads them."""

    def __init__(self) -> None:
        self._body: dict[str, Any] | None = None
        self._version: str | None = None
        self._found: tuple[Any, ...] = ()
        self._pods: list[dict[str, Any]] = []
        self.copies = 0  # how many times either was copied: changes when either changed

    def body(self, live: Mapping[str, Any]) -> dict[str, Any]:
        version = (live.get("metadata") or {}).get("resourceVersion")
        if self._body is None or version is None or version != self._version:
            self._body, self._version = copy.deepcopy(dict(live)), version
            self.copies += 1
        return self._body

    def pods(self, found: Any) -> list[dict[str, Any]]:
        found = tuple(found)  # the index replaces a pod's facts on each event of it
        if len(found) != len(self._found) or any(
                a is not b for a, b in zip(found, self._found, strict=True)):
            self._found, self._pods = found, [copy.deepcopy(p) for p in found]
            self.copies += 1
        return self._pods


class _ByJob(Mapping[str, list[dict[str, Any]]]):
    """An index keyed by (namespace, Job name), read only when asked."""

    def __init__(self, index: kopf.Index[Any, Any], namespace: str | None) -> None:
        self._index, self._namespace = index, namespace

    def __getitem__(self, job: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self._index.get((self._namespace, job), ())]

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


Passed = tuple[CapacityReport | None, object]  # the report, and what the stages answered


async def _guarded(shared: Shared, namespace: str, name: str, cadence: Cadence,
                   seen: Seen) -> Passed:
    """One pass; a failure is logged and retried on the next pass, never raised: kopf
    would back the daemon off and the route would go unreported."""
    try:
        return await _pass(shared, namespace, name, cadence, seen)
    except Exception:
        log.exception("tracker report of %s/%s failed; retrying on the next pass",
                      namespace, name)
        return None, None


async def _pass(shared: Shared, namespace: str, name: str, cadence: Cadence,
                seen: Seen) -> Passed:
    """The pass's report, and the stages' answers (None where the Tracker did not take
    the report: the next pass retries at the full rate)."""
    body, settings = seen.body, shared.ctx.settings
    spec = kube_inputs.route_spec(body)
    if spec is None:
        return None, ()  # an invalid route has nothing to report; the planner says why
    deleting = bool(body["metadata"].get("deletionTimestamp"))
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"].get("generation") and not deleting:
        return None, ()  # the reconcile has not settled this spec yet: anything said is moot
    await _ensure_cluster_id(shared)
    pods = kube_inputs.current_pods(seen.pods, name, int(status.get("epoch") or 0))
    node_labels = {n: await _node_labels(shared, n) for n in kube_inputs.node_names(pods)}
    lane = kube_inputs.lane(spec, body, pods, node_labels)
    view = kube_inputs.route_view(body, spec, seen.artifacts.get(spec.artifact_ref.name))
    stages = kube_inputs.stage_views(spec, pods, settings.worker_grpc_port)
    decision, observed = _certification(shared, seen, view.ready and not deleting, lane)
    job = await _job_inputs(shared, body, observed, pods, stages) \
        if decision.create_job else None
    state = lanes.state(lane, decision.certificate)
    replicas = kube_inputs.replica_views(spec, body, seen.pods, settings.worker_grpc_port)
    stepped = await step(shared.reporting, cadence, view, stages, state,
                         replicas=replicas or None,
                         tls=operator_tls(namespace, name, spec, seen.identity))
    report, delivery = stepped.report, stepped.delivery
    if delivery is not None and not delivery.ok:
        log.warning("report of %s/%s did not reach the Tracker after %d attempts: %s",
                    namespace, name, delivery.attempts, delivery.error)
    error = None if delivery is None or delivery.ok else delivery.error[:1024]
    if delivery is None and cadence.last_success is None and shared.reporting.client:
        error = (status.get("tracker") or {}).get("deliveryError")  # not due: unchanged
    shown = Shown(report, error, route_speculation(spec.recipe, stages, stepped.samples),
                  route_exactness(spec.recipe, stages, stepped.samples))
    if not deleting:
        await _execute(shared, body, plan_pass(body, decision, job, shown, utc_now()))
    # A stage that keeps failing is quiet too, whatever its error says this time.
    answers = tuple((n, s.info, s.capacity) for n, s in sorted(stepped.samples.items()))
    return report, answers if error is None else None


async def _execute(shared: Shared, seen: Mapping[str, Any], plan: Plan) -> None:
    """Carry the pass's plan out against a fresh read: kopf's live body lags the watch (our
    own last write included), and its resourceVersion also moves with writes that touch
    nothing of ours. One read per change; none in steady state."""
    if plan.status is None and not plan.steps:
        return
    meta = seen["metadata"]
    namespace, name = meta.get("namespace", "default"), meta["name"]
    client = shared.ctx.client
    fresh = await client.get(owner_path(shardroute.PLURAL, namespace, name))
    basis = _basis(seen)
    if fresh is None or _basis(fresh) != basis:
        return  # gone, or the reconcile moved on since this pass looked: judged anew next pass
    try:
        await execute(client, fresh, shardroute.PLURAL, plan, STATUS_KEYS,
                      still_current=lambda current: _basis(current) == basis)
    except KubeApiError as exc:
        if exc.status not in (404, 409):  # deleted, or rewritten throughout: next pass
            raise


def _basis(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a pass's report and certification decision rest on, of the route's status."""
    status = body.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or []
                  if c.get("type") == "Ready"), None)
    return (status.get("observedGeneration"), status.get("epoch"), status.get("routeDigest"),
            status.get("recipeDigest"), status.get("manifestDigest"), ready)


def _certification(shared: Shared, seen: Seen, ready: bool,
                   lane: CertifiedLane | None) -> tuple[Decision, Observation]:
    """Decide about the lane's certificate from what the watches show of its Job (hundreds
    of uncertified routes cost the API server nothing)."""
    settings = shared.ctx.settings.tracker
    body, meta = seen.body, seen.body["metadata"]
    request = (meta.get("annotations") or {}).get(jobs.RECERTIFY) or None
    stored = kube_inputs.stored_certificate(body)
    job_name = jobs.job_name(meta["name"], lane, request) if lane else ""
    job = next(iter(seen.jobs[job_name]), None) if lane else None
    outcome = jobs.job_outcome(job, seen.job_pods[job_name]) if job is not None else None
    observed = Observation(lane=lane, route_ready=ready, stored=stored, request=request,
                           job_exists=job is not None, outcome=outcome,
                           image=settings.certify_images.get(lane.backend) if lane else None,
                           job_name=job_name)
    decision = decide(observed)
    if decision.certificate is not None and decision.certificate != stored:
        shared.reporting.metrics.certifications.labels(
            "passed" if decision.certificate.passed else "failed").inc()
    return decision, observed


async def _job_inputs(shared: Shared, body: Mapping[str, Any], observed: Observation,
                      pods: Mapping[str, Any], stages: list[StageView]) -> jobs.JobInputs | None:
    """What the certification Job is made of: the first stage pod whole (the index keeps
    only facts of it); None until every stage has an endpoint."""
    endpoints = [s.endpoint for s in stages]
    if observed.lane is None or not all(endpoints) or not pods:
        return None
    meta, status = body["metadata"], body.get("status") or {}
    namespace, name = meta.get("namespace", "default"), meta["name"]
    first = pods.get(stages[0].name) or next(iter(pods.values()))
    stage_pod = await shared.ctx.client.get(
        path("v1", "pods", namespace, first["metadata"]["name"]))
    if stage_pod is None:
        return None  # replaced meanwhile: the next pass sees the new one
    settings = shared.ctx.settings.tracker
    return jobs.JobInputs(
        route=RouteRef(name, namespace, meta.get("uid", "")), lane=observed.lane,
        stage_pod=stage_pod, endpoints=[str(e) for e in endpoints], image=observed.image or "",
        gates=settings.gates, route_digest=status.get("routeDigest"),
        epoch=int(status.get("epoch") or 0), request=observed.request,
        deadline_seconds=settings.certify_deadline_seconds)


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
            found = await shared.ctx.client.get("/api/v1/namespaces/kube-system") or {}
        except KubeApiError:
            found = {}
        shared.cluster_id = (found.get("metadata") or {}).get("uid") or "unknown"
    shared.reporting.provider = shared.reporting.provider.model_copy(
        update={"cluster": shared.cluster_id})

