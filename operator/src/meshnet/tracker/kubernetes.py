"""Report inputs read from Kubernetes objects: the ShardRoute, its stage pods and their
nodes (pure: the daemon does the I/O; tracker/planner.py plans what it shows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from meshnet.api import labels
from meshnet.api.certification import Certificate, CertifiedLane
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.certify.lane import gpu_product, promises
from meshnet.tracker.inputs import ReplicaView, RouteView, StageView


def route_spec(body: Mapping[str, Any]) -> ShardRouteSpec | None:
    try:
        return ShardRouteSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None  # an invalid route has nothing to report; the planner says why


def route_view(body: Mapping[str, Any], spec: ShardRouteSpec,
               artifact: Mapping[str, Any] | None) -> RouteView:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    ready = _condition(status, "Ready")
    gguf = ((artifact or {}).get("status") or {}).get("gguf") or {}
    return RouteView(
        name=meta.get("name", ""), namespace=meta.get("namespace", "default"),
        route_id=f"{meta.get('namespace', 'default')}/{meta.get('name', '')}",
        recipe=spec.recipe, epoch=int(status.get("epoch") or 0),
        route_digest=status.get("routeDigest"), manifest_digest=status.get("manifestDigest"),
        recipe_digest=status.get("recipeDigest"),
        architecture=gguf.get("architecture"), block_count=gguf.get("blockCount"),
        ready=ready.get("status") == "True",
        not_ready=ready.get("message") or ready.get("reason") or "",
        deleting=bool(meta.get("deletionTimestamp")), endpoint=status.get("endpoint"))


def pod_facts(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the report needs of a pod (an index keeps this much, not whole pods)."""
    meta, spec, status = (body.get(k) or {} for k in ("metadata", "spec", "status"))
    return {"metadata": {k: meta.get(k) for k in ("name", "labels", "deletionTimestamp")},
            "spec": {"nodeName": spec.get("nodeName")},
            "status": {k: status.get(k) for k in ("phase", "podIP", "conditions",
                                                   "containerStatuses")}}


def current_pods(pods: Sequence[Mapping[str, Any]], route: str, epoch: int,
                 replica: int = 0) -> dict[str, Mapping[str, Any]]:
    """The live stage pod of each stage at this epoch, by stage name: one replica's
    (replica 0's unless asked), so that a pipeline is reported whole, never a mix."""
    found: dict[str, Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        tags = meta.get("labels") or {}
        if tags.get(labels.ROUTE) == route and tags.get(labels.EPOCH) == str(epoch) \
                and tags.get(labels.REPLICA, "0") == str(replica) \
                and labels.STAGE in tags and not meta.get("deletionTimestamp"):
            found[tags[labels.STAGE]] = pod
    return found


def replica_views(spec: ShardRouteSpec, body: Mapping[str, Any],
                  pods: Sequence[Mapping[str, Any]], grpc_port: int) -> list[ReplicaView]:
    """Every replica status.replicaStatuses says is ready, with the stages of the pipeline
    serving it (its epoch there: an older one while a rollout has not reached it); empty
    for a status written before replicas, whose only pipeline `current_pods` gives."""
    route = (body.get("metadata") or {}).get("name", "")
    found = []
    for entry in (body.get("status") or {}).get("replicaStatuses") or []:
        replica, epoch = entry.get("replica"), entry.get("epoch")
        if not entry.get("ready") or replica is None or epoch is None:
            continue
        serving = current_pods(pods, route, int(epoch), replica=int(replica))
        found.append(ReplicaView(int(replica), int(epoch),
                                 stage_views(spec, serving, grpc_port)))
    return found


def stage_views(spec: ShardRouteSpec, pods: Mapping[str, Mapping[str, Any]],
                grpc_port: int) -> list[StageView]:
    """Stages dialled at their pod IP: no cluster DNS needed, and a pod of another epoch
    can never answer for the route."""
    views = []
    for stage in spec.stages:
        pod = pods.get(stage.name)
        status = (pod or {}).get("status") or {}
        ip = status.get("podIP")
        containers = status.get("containerStatuses") or []
        running = next((c["state"]["running"] for c in containers
                        if (c.get("state") or {}).get("running")), None)
        waiting = next((c["state"]["waiting"] for c in containers
                        if (c.get("state") or {}).get("waiting")), None)
        ready = _condition(status, "Ready").get("status") == "True"
        problem = ("" if ready else f"stage {stage.name}: " + (
            f"pod {(pod.get('metadata') or {}).get('name')} is"
            f" {(waiting or {}).get('reason') or status.get('phase') or 'not ready'}"
            if pod else "no pod at this epoch"))
        views.append(StageView(
            name=stage.name, begin=stage.layers.begin, end=stage.layers.end,
            endpoint=f"{ip}:{grpc_port}" if ip else None, ready=ready,
            restarts=sum(int(c.get("restartCount", 0)) for c in containers),
            started_at=_unix(running.get("startedAt")) if running else None, problem=problem))
    return views


def node_names(pods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted({str(n) for p in pods.values() if (n := (p.get("spec") or {}).get("nodeName"))})


def lane(spec: ShardRouteSpec, body: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]],
         node_labels: Mapping[str, Mapping[str, str]]) -> CertifiedLane | None:
    """The route's lane; None until its digests are known and (on a GPU lane) every stage
    pod is on a node whose labels were read."""
    status = body.get("status") or {}
    manifest, recipe = status.get("manifestDigest"), status.get("recipeDigest")
    if not manifest or not recipe:
        return None
    nodes = [(p.get("spec") or {}).get("nodeName") for p in pods.values()]
    if spec.recipe.lane != "cpu" and (len(pods) < len(spec.stages)
                                      or any(n not in node_labels for n in nodes)):
        return None
    known = [node_labels[str(n)] for n in nodes if n in node_labels]
    product = gpu_product(spec.recipe.lane, known)
    return CertifiedLane(backend=spec.recipe.lane, gpu_product=product,
                         manifest_digest=manifest, recipe_digest=recipe,
                         **promises(spec.recipe))


def stored_certificate(body: Mapping[str, Any]) -> Certificate | None:
    raw = (body.get("status") or {}).get("certification")
    try:
        return Certificate.model_validate(raw) if raw else None
    except ValidationError:
        return None  # written by another version: certify again


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _unix(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
