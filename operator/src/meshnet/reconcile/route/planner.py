"""The pure planner: observed state + spec -> the actions, events and status of one
reconcile. No I/O; `meshnet.operator.executor` carries the plan out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from meshnet.api import labels
from meshnet.api.checks import Problem, drafter_problems, route_problems
from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import Recipe, ShardRouteSpec, Stage
from meshnet.digests import recipe_digest, route_digest
from meshnet.reconcile.naming import gateway_name, service_name
from meshnet.reconcile.plan import Action, Create, Delete, Event, Patch, Plan, steps
from meshnet.reconcile.route import status as derive
from meshnet.reconcile.route.gatewayspec import gateway_deployment, gateway_service, gateway_url
from meshnet.reconcile.route.identity import IssuedIdentity, LinkTls, link_tls
from meshnet.reconcile.route.linkcompression import (
    compressed_legs,
    compressing_stages,
    replica_compresses,
)
from meshnet.reconcile.route.networkpolicy import policy_name, stage_policy
from meshnet.reconcile.route.observed import (
    Observed,
    ObservedPod,
    ObservedRoute,
    ReferencedArtifact,
)
from meshnet.reconcile.route.placement import (
    PlacementPlan,
    assigned_stage,
    cleanup,
    plan_placement,
)
from meshnet.reconcile.route.podspec import (
    RouteRef,
    StageInputs,
    WorkerConfig,
    child_labels,
    headless_service,
    owner_reference,
    stage_pod,
)
from meshnet.reconcile.route.probespec import PlacementConfig
from meshnet.reconcile.route.rollout import RolloutPlan, in_place, roll
from meshnet.reconcile.route.topology import stage_links
from meshnet.reconcile.route.workerspec import (
    Identities,
    LoopSpeculation,
    StageDrafter,
    WorkerSpec,
)

STATUS_KEYS = ("observedGeneration", "epoch", "routeDigest", "recipeDigest", "manifestDigest",
               "replicas", "readyReplicas", "updatedReplicas", "draining", "selector", "stages",
               "replicaStatuses", "stagesReady", "coverage", "capacity", "endpoint", "conditions",
               "placement", "compressedLegs")


Desired = tuple[dict[str, Any], WorkerSpec]  # a stage's pod and its worker
PodKey = derive.PodKey  # (replica, stage)


def plan(observed: Observed, config: WorkerConfig, now: datetime,
         placement: PlacementConfig | None = None) -> Plan:
    """One level-based step towards the spec; safe to repeat with the same inputs."""
    route = observed.route
    if route.deleting:
        return Plan(steps=steps(_delete_children(observed)))
    problems = spec_problems(route, observed.artifact, config)
    if route.spec is None or problems:
        return _invalid(observed, problems, config, now)
    artifact = observed.artifact
    if artifact is None or not artifact.ready or artifact.manifest_digest is None:
        return _waiting(observed, route.spec, config, now)
    return _rollout(observed, route.spec, artifact.manifest_digest, config, now,
                    placement or PlacementConfig())


def spec_problems(route: ObservedRoute, artifact: ReferencedArtifact | None,
                  config: WorkerConfig) -> list[Problem]:
    """Why the route's spec cannot be planned (with this artifact); empty when it can."""
    spec = route.spec
    if spec is None:
        return [Problem("", error) for error in route.spec_errors]
    block_count = artifact.block_count if artifact else None
    problems = route_problems(spec, block_count)
    if artifact is not None:
        problems += drafter_problems(spec, artifact.headers_read, artifact.drafter)
    lane = spec.recipe.lane
    if spec.recipe.image is None and lane not in config.images:
        problems.append(Problem("spec.recipe", f"no worker image for lane {lane}; set"
                                               " recipe.image"))
    return problems


def _waiting(observed: Observed, spec: ShardRouteSpec, config: WorkerConfig,
             now: datetime) -> Plan:
    """The artifact is not Ready (not provisioned yet, or its changed spec failed, e.g. a
    wrong sha256): nothing rolls out and nothing is deleted. Pods already running keep
    serving their epoch's manifest, whose files a failed pull leaves in place, and status
    keeps describing them."""
    artifact, route = observed.artifact, observed.route
    why = artifact.message if artifact else "it does not exist"
    message = f"waiting for ModelArtifact {spec.artifact_ref.name} to be Ready: {why}"
    epoch = int(route.status.get("epoch") or 0)
    current = {(p.replica, p.stage): p for p in observed.pods
               if not p.terminating and p.epoch == epoch}
    if not current:
        return _finish(observed, derive.waiting_for_artifact(message), config, now, {},
                       _served(observed, spec, {}, config))
    message += f"; the pods of epoch {epoch} keep serving meanwhile"
    served = derive.Served(derive.recorded_layout(route.status), current,
                    1 + max(r for r, _ in current), 0, route.status.get("endpoint"))
    return _finish(observed, derive.waiting_for_artifact(message), config, now, {}, served)


def _invalid(observed: Observed, problems: Sequence[Problem], config: WorkerConfig,
             now: datetime) -> Plan:
    """A spec that cannot be planned rolls nothing out and deletes nothing: the pods
    already running keep serving the last valid spec (its stages as status recorded
    them) until the spec is fixed, as a Deployment keeps its old pods when an update
    cannot roll out. Conditions and one event per distinct message say why."""
    route = observed.route
    epoch = int(route.status.get("epoch") or 0)
    running = [p for p in observed.pods if not p.terminating]
    message = "; ".join(map(str, problems))
    reason = problems[0].reason if problems else "InvalidSpec"
    if running:
        message += f"; the pods of epoch {epoch} keep serving until the spec is fixed"
    old = {c.get("type"): c for c in route.status.get("conditions") or []}
    seen = (old.get("Degraded") or {}).get("message") == message
    events = () if seen else (Event("Warning", reason, message),)
    layout = derive.recorded_layout(route.status) if running else ()
    current = {(p.replica, p.stage): p for p in running if p.epoch == epoch}
    replicas = 1 + max((p.replica for p in running), default=-1)
    served = derive.Served(layout, current, replicas, 0,  # no slots: not Ready
                    route.status.get("endpoint"))
    result = _finish(observed, derive.invalid(message, reason), config, now, {}, served)
    return Plan(events=events, status=result.status, conditions=result.conditions,
                own_conditions=result.own_conditions)


def _rollout(observed: Observed, spec: ShardRouteSpec, manifest: str, config: WorkerConfig,
             now: datetime, placement_config: PlacementConfig) -> Plan:
    route = observed.route
    recipe = recipe_digest(config.pin_digest, spec.recipe.identity())
    digest = route_digest(manifest, recipe, [(s.layers.begin, s.layers.end) for s in spec.stages])
    epoch, advanced = next_epoch(route.status, observed.pods, digest)
    ref = RouteRef(route.name, route.namespace, route.uid)
    # (not mid-rollout: a new epoch's pinned pod may wait for the old one's resources)
    unschedulable = frozenset(p.stage for p in observed.pods if p.unschedulable
                              and not p.terminating) \
        if all(p.epoch == epoch for p in observed.pods) else frozenset()
    placed = plan_placement(ref, spec, route.status.get("placement"),
                            _serving_nodes(observed.pods, spec, epoch), observed.probes, now,
                            placement_config, unschedulable)
    reassigned = dict(placed.assignment) != ((route.status.get("placement") or {})
                                             .get("assignment") or {})
    if reassigned and not advanced:  # which node serves which range changed: a new epoch
        epoch, advanced = max([epoch, *(p.epoch for p in observed.pods)]) + 1, True
    assert observed.artifact is not None and observed.artifact.storage is not None
    identities = Identities(manifest, recipe, digest)
    route_id, storage = f"{route.namespace}/{route.name}", observed.artifact.storage
    desired: dict[PodKey, Desired] = {}
    tls = link_tls(spec.tls, observed.identity)
    key_secret = observed.identity.secret_name if observed.identity else None
    packing = compressing_stages(spec, placed.status, {
        p.stage: p.compressing for p in observed.pods
        if p.replica == 0 and p.epoch == epoch and not p.terminating},
        placement_config.compression_break_even_bits_per_second)
    for replica in range(spec.replicas):
        for i, stage in enumerate(spec.stages):
            worker = stage_worker(spec.stages, i, spec.recipe, tls, epoch, identities,
                                  observed.artifact.model_file, route_id, replica,
                                  observed.artifact.drafter_file,
                                  observed.artifact.architecture, key_secret,
                                  replica_compresses(spec, replica, stage.name, packing))
            # (measured placement orders replica 0: the others stay the scheduler's)
            node = placed.assignment.get(stage.name) if replica == 0 else None
            body = stage_pod(StageInputs(ref, assigned_stage(stage, node), spec.recipe,
                                         storage, worker), config)
            desired[replica, stage.name] = (body, worker)
    if config.side_by_side:
        names = [s.name for s in spec.stages]
        rolled = roll(observed.pods, names, epoch, spec.replicas, spec.rollout, now)
        if drained := _drained(observed, ref, spec, config, rolled.serving):
            rolled = roll(observed.pods, names, epoch, spec.replicas, spec.rollout, now,
                          drained)
        actions, events = _rolling_pod_actions(observed.pods, desired, epoch, spec, rolled)
        serving, draining, requeue = rolled.serving, rolled.draining, rolled.requeue_after
    else:
        actions, events = _pod_actions(observed.pods, desired, epoch, spec.replicas)
        serving, draining, requeue = dict.fromkeys(range(spec.replicas), epoch), [], None
    actions += _service_actions(observed, ref, config, spec.replicas)
    actions += _policy_actions(observed, ref, config)
    actions += _gateway_actions(observed, ref, spec, config, serving)
    actions += placed.actions
    events += placed.events
    if advanced:
        previous = route.status.get("epoch") or 0
        why = "stages reassigned to measured nodes" if reassigned and \
            route.status.get("routeDigest") == digest else f"route digest {digest[:12]}"
        events.insert(0, Event("Normal", "EpochAdvanced", f"epoch {previous} -> {epoch}: {why}"))
    if route.generation != route.status.get("observedGeneration"):  # once per spec change
        events += [Event("Warning", "RemovedField", w) for w in spec.recipe.removed_fields()]
    current = {(p.replica, p.stage): p for p in observed.pods
               if serving.get(p.replica) == p.epoch and (p.replica, p.stage) in desired}
    rolling = any(p.epoch != epoch for p in observed.pods)
    verdict = derive.from_stages(spec, current, rolling, epoch)
    identity = {"epoch": epoch, "routeDigest": digest, "recipeDigest": recipe,
                "manifestDigest": manifest, "placement": placed.status,
                "compressedLegs": compressed_legs(spec, packing) or None}
    result = _finish(observed, verdict, config, now, identity,
                     _served(observed, spec, current, config, tuple(draining)))
    return Plan(steps(actions), tuple(events), result.status, advanced, result.conditions,
                result.own_conditions, _sooner(requeue, placed))


def _serving_nodes(pods: Sequence[ObservedPod], spec: ShardRouteSpec,
                   epoch: int) -> dict[str, str] | None:
    """Stage -> node of replica 0 at `epoch`; None while the route rolls out or a stage
    pod is missing, not running or not yet on a node."""
    if any(p.epoch != epoch for p in pods):
        return None
    nodes = {p.stage: p.node for p in pods
             if p.replica == 0 and not p.terminating and p.node and p.phase == "Running"}
    return nodes if all(s.name in nodes for s in spec.stages) else None


def _sooner(requeue: float | None, placed: PlacementPlan) -> float | None:
    times = [t for t in (requeue, placed.requeue_after) if t is not None]
    return min(times, default=None)


def stage_worker(stages: Sequence[Stage], index: int, recipe: Recipe, tls: LinkTls | None,
                 epoch: int, identities: Identities, model_file: str,
                 route_id: str, replica: int = 0,
                 drafter_file: str | None = None,
                 architecture: str | None = None,
                 route_key_secret: str | None = None,
                 compress_boundaries: bool = False) -> WorkerSpec:
    """The worker of `stages[index]` in `replica` at `epoch`: every replica's is the same
    but for the addresses of its links. The last stage hosts the recipe's drafter (the
    artifact's `drafter_file` for DSpark); the prefix cache's defaults are the lane's and
    the model `architecture`'s; `compress_boundaries`: it packs what it relays
    (linkcompression.py decides)."""
    stage = stages[index]
    speculation = recipe.speculation
    entries = recipe.prefix_cache.stage_entries(recipe.lane)
    kind = speculation.stage_drafter()
    drafter = (StageDrafter(kind, speculation.max_drafts,
                            drafter_file if kind is DrafterKind.DSPARK else None)
               if kind is not None and index == len(stages) - 1 else None)
    return WorkerSpec(
        stage=stage.name,
        layers=stage.layers,
        route_id=route_id,
        epoch=epoch,
        identities=identities,
        model_file=model_file,
        slots=recipe.session_slots,
        context_length=recipe.context_length,
        boundary_dtype=recipe.boundary_dtype,
        pipeline_depth=len(stages),
        offload=bool(stage.resources.gpus) and recipe.lane != "cpu",
        tls=tls,
        route_key_secret=route_key_secret,
        links=stage_links(recipe.topology, [s.name for s in stages], index),
        loop=LoopSpeculation(speculation.loop_drafts(), speculation.loop_windows())
        if index == 0 else None,
        discard_depth=speculation.discard_depth(),
        prefix_cache_entries=entries,
        prefix_block=recipe.prefix_cache.stage_block(architecture) if entries else 0,
        throughput_batching=recipe.batching == "Throughput",
        replica=replica,
        drafter=drafter,
        compress_boundaries=compress_boundaries,
    )


def next_epoch(status: Mapping[str, Any], pods: Sequence[ObservedPod],
               digest: str) -> tuple[int, bool]:
    """(epoch, advanced): +1 exactly when the routeDigest changed. A lost status adopts pods
    already running this digest instead of restarting them."""
    previous = int(status.get("epoch") or 0)
    if status.get("routeDigest") == digest:
        return previous, False
    running = [p.epoch for p in pods if p.digest == digest[:16]]
    if status.get("routeDigest") is None and running and max(running) >= previous:
        return max(running), False
    return max([previous, *(p.epoch for p in pods)]) + 1, True


def _pod_actions(pods: Sequence[ObservedPod], desired: Mapping[PodKey, Desired],
                 epoch: int, replicas: int) -> tuple[list[Action], list[Event]]:
    """Without side-by-side rollouts (the local backend, which keeps the old epoch's
    workers serving itself): old-epoch pods go first; new ones are created only once no
    other epoch is left. One event per kind of change (each API write counts at scale,
    and one line per reconcile reads better than one per pod)."""
    actions, events = _deletions(pods, desired, epoch, replicas)
    if any(p.epoch != epoch for p in pods):
        return actions, events  # never mix epochs: wait until the old ones are gone
    present = {(p.replica, p.stage) for p in pods}
    return actions, events + _creations(actions, desired, present, epoch)


def _rolling_pod_actions(pods: Sequence[ObservedPod], desired: Mapping[PodKey, Desired],
                         epoch: int, spec: ShardRouteSpec,
                         rolled: RolloutPlan) -> tuple[list[Action], list[Event]]:
    """The rollout's pipelines (meshnet.reconcile.route.rollout), then within the epoch:
    a pod whose template changed or that ended is replaced in place, a replica at a time
    (`in_place`), and the missing pods of the replicas the rollout lets start are
    created."""
    replicas, max_unavailable = spec.replicas, spec.rollout.max_unavailable
    stages = [s.name for s in spec.stages]
    actions, events = list(rolled.actions), list(rolled.events)
    live = [p for p in pods if not p.terminating and p.epoch == epoch and p.replica < replicas]
    outdated = {p.replica for p in live if _delete_reason(p, desired, epoch, replicas)}
    allowed = in_place(pods, stages, epoch, rolled.serving, outdated, max_unavailable)
    more, noted = _deletions([p for p in live if p.replica in allowed], desired, epoch,
                             replicas)
    actions += more
    events += noted
    present = {(p.replica, p.stage) for p in pods if p.epoch == epoch}
    wanted = {key: value for key, value in desired.items() if key[0] in rolled.creatable}
    return actions, events + _creations(actions, wanted, present, epoch)


def _deletions(pods: Sequence[ObservedPod], desired: Mapping[PodKey, Desired], epoch: int,
               replicas: int) -> tuple[list[Action], list[Event]]:
    """The pods that go as `_delete_reason` says, and one event per kind of change."""
    actions: list[Action] = []
    deleted: dict[tuple[str, str], list[str]] = {}  # (event reason, why) -> pod names
    for pod in pods:
        why = _delete_reason(pod, desired, epoch, replicas)
        if why and not pod.terminating:
            actions.append(Delete("Pod", pod.name))
            deleted.setdefault(why, []).append(pod.name)
    events: list[Event] = []
    for reason in dict.fromkeys(kind for kind, _ in deleted):  # in order, each once
        events.append(Event("Normal", reason, "; ".join(
            f"deleted pod{'s' * (len(names) > 1)} {', '.join(names)}: {why}"
            for (kind, why), names in deleted.items() if kind == reason)))
    return actions, events


def _creations(actions: list[Action], desired: Mapping[PodKey, Desired],
               present: set[PodKey], epoch: int) -> list[Event]:
    """Appends a Create for each desired pod not `present`; the event naming them."""
    created: list[str] = []
    for (replica, stage), (body, worker) in desired.items():
        if (replica, stage) not in present:
            actions.append(Create(body, worker))
            of = f" of replica {replica}" if replica else ""
            created.append(f"{body['metadata']['name']} for stage {stage}{of}"
                           f" (layers {worker.layers})")
    if not created:
        return []
    return [Event("Normal", "StagePodCreated", f"created pod{'s' * (len(created) > 1)}"
                  f" {', '.join(created)}, epoch {epoch}")]


def _delete_reason(pod: ObservedPod, desired: Mapping[PodKey, Desired], epoch: int,
                   replicas: int) -> tuple[str, str] | None:
    """(event reason, why) a pod goes; None while it serves as wanted."""
    if pod.replica >= replicas:
        return "ReplicaRemoved", f"replica {pod.replica} is past spec.replicas {replicas}"
    if pod.epoch != epoch:
        return "StagePodReplaced", f"epoch {pod.epoch} is replaced by epoch {epoch}"
    if (pod.replica, pod.stage) not in desired:
        return "StagePodReplaced", f"stage {pod.stage} is no longer in the spec"
    want = desired[pod.replica, pod.stage][0]["metadata"]["labels"]
    if pod.template_hash != want.get(labels.TEMPLATE):
        return "StagePodReplaced", "its pod template changed"
    if pod.phase in ("Failed", "Succeeded"):
        return "StagePodReplaced", f"it has {pod.phase.lower()}"
    return None


def _service_actions(observed: Observed, ref: RouteRef, config: WorkerConfig,
                     replicas: int) -> list[Action]:
    """A headless Service per replica, as its template says; a scaled-away one's goes once
    its last pod has (a draining pipeline's sessions still reach its stages by name)."""
    actions: list[Action] = []
    for replica in range(replicas):
        service = headless_service(ref, config, replica)
        existing = observed.services.get(replica)
        if existing is None:
            actions.append(Create(service))
        elif existing != service["metadata"]["labels"][labels.TEMPLATE]:
            actions.append(Patch("Service", service["metadata"]["name"],
                                 {"metadata": {"labels": service["metadata"]["labels"]},
                                  "spec": service["spec"]}))
    running = {p.replica for p in observed.pods}
    return actions + [Delete("Service", service_name(observed.route.name, replica))
                      for replica in sorted(observed.services)
                      if replica >= replicas and replica not in running]


def _policy_actions(observed: Observed, ref: RouteRef, config: WorkerConfig) -> list[Action]:
    """The stages' NetworkPolicy as its template says (gone when the chart turns it off)."""
    existing = observed.network_policy_hash
    if not config.network_policy.enabled:
        return [] if existing is None else [Delete("NetworkPolicy", policy_name(ref.name))]
    body = stage_policy(ref.name, ref.namespace, owner_reference(ref), config.grpc_port,
                        config.metrics_port, config.network_policy, child_labels(ref))
    if existing is None:
        return [Create(body)]
    if existing != body["metadata"]["labels"][labels.TEMPLATE]:
        return [Patch("NetworkPolicy", body["metadata"]["name"],
                      {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]})]
    return []


def _gateway_actions(observed: Observed, ref: RouteRef, spec: ShardRouteSpec,
                     config: WorkerConfig, serving: Mapping[int, int]) -> list[Action]:
    """The gateway's Deployment and Service as the spec says (gone when disabled); its
    replicas are the pipelines `serving` names (replica -> epoch)."""
    if not _has_gateway(spec, config):
        return _delete_gateway(observed)
    wanted = (
        (_gateway_template(ref, spec, config, serving, observed.identity),
         observed.gateway_deployment_hash),
        (gateway_service(ref, config), observed.gateway_service_hash),
    )
    actions: list[Action] = []
    for body, existing in wanted:
        if existing is None:
            actions.append(Create(body))
        elif existing != body["metadata"]["labels"][labels.TEMPLATE]:
            actions.append(Patch(body["kind"], body["metadata"]["name"],
                                 {"metadata": {"labels": body["metadata"]["labels"]},
                                  "spec": body["spec"]}))
    return actions


def _drained(observed: Observed, ref: RouteRef, spec: ShardRouteSpec, config: WorkerConfig,
             serving: Mapping[int, int]) -> frozenset[tuple[int, int]]:
    """The draining pipelines that may go before drainSeconds: their stages hold no session
    and no gateway can send them one: its Deployment has rolled out the template of
    `serving`, which names no draining pipeline."""
    if not observed.idle_pipelines or not _has_gateway(spec, config):
        return observed.idle_pipelines
    template = _gateway_template(ref, spec, config, serving,
                                 observed.identity)["metadata"]["labels"][labels.TEMPLATE]
    if not observed.gateway_rolled_out or observed.gateway_deployment_hash != template:
        return frozenset()  # an old gateway pod may still admit sessions to it
    return observed.idle_pipelines


def _gateway_template(ref: RouteRef, spec: ShardRouteSpec, config: WorkerConfig,
                      serving: Mapping[int, int],
                      identity: IssuedIdentity | None) -> dict[str, Any]:
    """The gateway's Deployment for the pipelines `serving` names (replica -> epoch)."""
    return gateway_deployment(ref, spec.stages, spec.gateway, link_tls(spec.tls, identity),
                              spec.recipe.speculation, config,
                              [serving[r] for r in range(spec.replicas)],
                              spec.rollout.drain_seconds,
                              identity.secret_name if identity else None)


def _has_gateway(spec: ShardRouteSpec, config: WorkerConfig) -> bool:
    return spec.gateway.enabled and config.gateway_image is not None


def _delete_gateway(observed: Observed) -> list[Action]:
    name = gateway_name(observed.route.name)
    return [Delete(kind, name) for kind, existing in (
        ("Deployment", observed.gateway_deployment_hash),
        ("Service", observed.gateway_service_hash)) if existing is not None]


def _delete_children(observed: Observed) -> tuple[Action, ...]:
    actions: list[Action] = [Delete("Pod", p.name) for p in observed.pods if not p.terminating]
    actions += [Delete("Service", service_name(observed.route.name, replica))
                for replica in sorted(observed.services)]
    if observed.network_policy_hash is not None:
        actions.append(Delete("NetworkPolicy", policy_name(observed.route.name)))
    return (*actions, *_delete_gateway(observed), *cleanup(observed.probes))


def _served(observed: Observed, spec: ShardRouteSpec, current: Mapping[PodKey, ObservedPod],
            config: WorkerConfig, draining: tuple[str, ...] = ()) -> derive.Served:
    route = observed.route
    url = gateway_url(RouteRef(route.name, route.namespace, route.uid), config) \
        if _has_gateway(spec, config) else None
    return derive.Served(derive.layout_of(spec), current, spec.replicas, spec.recipe.session_slots,
                  url, draining)


def _finish(observed: Observed, verdict: derive.Verdicts, config: WorkerConfig, now: datetime,
            identity: dict[str, Any], served: derive.Served) -> Plan:
    """The new status (kept epoch/digests unless given) and whether it changed."""
    route, old = observed.route, observed.route.status
    status: dict[str, Any] = {k: old[k] for k in ("epoch", "routeDigest", "recipeDigest",
                                                 "manifestDigest", "placement",
                                                 "compressedLegs")
                              if old.get(k) is not None}
    status.update(identity)
    status.setdefault("epoch", 0)
    if route.generation is not None:
        status["observedGeneration"] = route.generation
    status["conditions"] = derive.conditions(verdict, old.get("conditions") or [],
                                             route.generation, now)
    if served.layout:
        derive.served_status(status, observed, served, config.grpc_port)
    if served.endpoint and "routeDigest" in status:
        status["endpoint"] = served.endpoint
    changed = {k: old.get(k) for k in STATUS_KEYS} != {k: status.get(k) for k in STATUS_KEYS}
    summary = {c["type"]: c["status"] for c in status["conditions"]}
    return Plan(status=status if changed else None, conditions=summary,
                own_conditions=derive.OWN_CONDITIONS)
