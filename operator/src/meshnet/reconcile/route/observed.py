"""What the planner sees: compact, typed views of the route, its pods and its artifact,
parsed from raw Kubernetes objects by pure functions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pydantic import ValidationError

from meshnet.api import labels
from meshnet.api.modelartifact import ArtifactStorage, GgufDrafter, ModelArtifactSpec
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.api.validate import artifact_drafter, block_count
from meshnet.reconcile.resource import ObservedResource, observe_resource
from meshnet.reconcile.route.identity import IssuedIdentity
from meshnet.reconcile.route.placement import ObservedProbes
from meshnet.reconcile.route.worker_command import COMPRESSED

# Container waiting reasons that mean the stage will not come up without help.
FAILING_REASONS = frozenset({
    "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})


@dataclass(frozen=True)
class ObservedPod:
    """One stage pod as the kubelet reports it."""

    name: str
    stage: str
    epoch: int
    replica: int = 0  # the route's pipeline it belongs to (0 for pods from before replicas)
    template_hash: str = ""
    digest: str = ""  # first 16 hex digits of the routeDigest it was started for
    uid: str = ""
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    restarts: int = 0
    failing_reason: str | None = None  # e.g. CrashLoopBackOff
    failing_message: str = ""
    unschedulable: str | None = None  # the scheduler's message
    draining_since: str | None = None  # its pipeline takes no new sessions since (RFC 3339)
    ip: str = ""  # where its worker answers (status.podIP; "" until it has one)
    node: str = ""  # the node it was scheduled on (spec.nodeName; "" until it is)
    compressing: bool = False  # its worker packs what it relays (--boundary-compression)


@dataclass(frozen=True)
class ReferencedArtifact:
    """The referenced ModelArtifact, reduced to what a route needs."""

    name: str
    ready: bool
    message: str = ""
    manifest_digest: str | None = None
    block_count: int | None = None
    model_file: str = ""
    storage: ArtifactStorage | None = None
    headers_read: bool = False  # status.gguf is there: `drafter` is known
    drafter: GgufDrafter | None = None  # the drafter its headers show
    drafter_file: str | None = None  # its file of role Drafter (a DSpark GGUF)
    architecture: str | None = None  # general.architecture (headers, else expectations)


ObservedRoute = ObservedResource[ShardRouteSpec]


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of one route is based on."""

    route: ObservedRoute
    pods: tuple[ObservedPod, ...] = ()
    # replica -> template hash of its existing headless Service (absent: none)
    services: Mapping[int, str] = field(default_factory=dict)
    artifact: ReferencedArtifact | None = None
    # template hashes of the gateway's Deployment and Service (None: absent)
    gateway_deployment_hash: str | None = None
    gateway_service_hash: str | None = None
    # Every pod of the gateway's Deployment runs its latest template (its rollout is done):
    # no gateway still admits sessions to a pipeline the template no longer names.
    gateway_rolled_out: bool = False
    # Draining pipelines (replica, epoch) whose every stage answered that it holds no
    # session: looked up by the operator (I/O) only while a pipeline drains.
    idle_pipelines: frozenset[tuple[int, int]] = frozenset()
    # The route's identity Secret (CA, leaves, route key) as the operator ensured it before
    # planning; None where no backend issues one (`meshnet up`: loopback, plaintext).
    identity: IssuedIdentity | None = None
    # template hash of the stages' NetworkPolicy (None: absent)
    network_policy_hash: str | None = None
    # The probe agents, measuring Jobs and token Secret of spec.placement Measured.
    probes: ObservedProbes = field(default_factory=ObservedProbes)


def observe_route(body: Mapping[str, Any]) -> ObservedRoute:
    return observe_resource(body, ShardRouteSpec)


def observe_pod(body: Mapping[str, Any]) -> ObservedPod | None:
    """None for pods that do not carry the route/stage/epoch labels."""
    meta = body.get("metadata") or {}
    tags = meta.get("labels") or {}
    if labels.STAGE not in tags or not str(tags.get(labels.EPOCH, "")).isdigit():
        return None
    status = body.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    containers = status.get("containerStatuses") or []
    waiting = [(c.get("state") or {}).get("waiting") or {} for c in containers]
    failing = next((w for w in waiting if w.get("reason") in FAILING_REASONS), None)
    scheduled = conditions.get("PodScheduled") or {}
    return ObservedPod(
        name=meta.get("name", ""), stage=tags[labels.STAGE], epoch=int(tags[labels.EPOCH]),
        replica=replica_of(tags),
        template_hash=tags.get(labels.TEMPLATE, ""), digest=tags.get(labels.DIGEST, ""),
        uid=meta.get("uid", ""),
        phase=status.get("phase", "Pending"),
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        terminating=bool(meta.get("deletionTimestamp")),
        restarts=sum(int(c.get("restartCount", 0)) for c in containers),
        failing_reason=failing.get("reason") if failing else None,
        failing_message=_failing_message(failing, containers, meta) if failing else "",
        unschedulable=scheduled.get("message", "unschedulable")
        if scheduled.get("reason") == "Unschedulable" else None,
        draining_since=(meta.get("annotations") or {}).get(labels.DRAINING_ANNOTATION),
        ip=str(status.get("podIP") or ""),
        node=str((body.get("spec") or {}).get("nodeName") or ""),
        compressing=_compressing(body.get("spec") or {}),
    )


def _compressing(spec: Mapping[str, Any]) -> bool:
    """The pod's worker was started with --boundary-compression shuffle-lz4."""
    args = [str(a) for c in spec.get("containers") or [] for a in c.get("args") or []]
    return any(flag == "--boundary-compression" and value == COMPRESSED
               for flag, value in pairwise(args))


def gateway_rolled_out(body: Mapping[str, Any]) -> bool:
    """The Deployment controller has seen its latest spec and every pod it counts runs
    that template (old pods that are still terminating are not counted: their listener is
    closed, they only finish what they run)."""
    meta, spec, status = (body.get(k) or {} for k in ("metadata", "spec", "status"))
    wanted = int(spec.get("replicas", 1))
    return (int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 1)
            and int(status.get("updatedReplicas") or 0) == wanted
            and int(status.get("replicas") or 0) == wanted)


def replica_of(tags: Mapping[str, str]) -> int:
    """The replica a stage pod or headless Service belongs to, by its label (default 0)."""
    value = str(tags.get(labels.REPLICA, "0"))
    return int(value) if value.isdigit() else 0


def _failing_message(waiting: Mapping[str, Any], containers: list[dict[str, Any]],
                     meta: Mapping[str, Any]) -> str:
    """The kubelet's message, and for a container that ran and died how it ended and
    where its logs are (kept: a crash-looping pod is never replaced, so --previous works)."""
    parts = [str(waiting.get("message", ""))] if waiting.get("message") else []
    ended = next((t for c in containers
                  if (t := (c.get("lastState") or {}).get("terminated"))), None)
    if ended:
        why = f" ({ended['reason']})" if ended.get("reason") else ""
        parts.append(f"last exit code {ended.get('exitCode')}{why}; its logs: kubectl logs "
                     f"-n {meta.get('namespace', 'default')} {meta.get('name', '')} --previous")
    return "; ".join(parts)


def observe_referenced_artifact(body: Mapping[str, Any]) -> ReferencedArtifact:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    name = meta.get("name", "")
    try:
        spec = ModelArtifactSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        why = f"invalid spec: {exc.errors()[0]['msg']}"
        return ReferencedArtifact(name, ready=False, message=why)
    conditions = status.get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    digest = status.get("manifestDigest")
    is_ready = ready.get("status") == "True" and digest == spec.manifest_digest()
    # The reason too (HashMismatch, DownloadFailed...): the message alone names no failure.
    message = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k)) \
        or "not provisioned yet"
    headers_read, drafter = artifact_drafter(dict(body))
    if ready.get("status") == "True" and not is_ready:
        message = "status.manifestDigest does not match the files in its spec"
    return ReferencedArtifact(
        name, ready=is_ready, message="" if is_ready else message, manifest_digest=digest,
        block_count=block_count(dict(body)), model_file=spec.model_file(), storage=spec.storage,
        headers_read=headers_read, drafter=drafter, drafter_file=spec.drafter_file(),
        architecture=((status.get("gguf") or {}).get("architecture")
                      or spec.expectations.architecture),
    )
