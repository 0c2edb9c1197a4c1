"""Pure builders of a route's children: the worker's arguments, the stage pod and the
headless Service. Nothing here talks to the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from meshnet.api import labels
from meshnet.api.common import API_VERSION
from meshnet.api.modelartifact import ArtifactStorage
from meshnet.api.shardroute import DEFAULT_GPU_RESOURCES, KIND, Recipe, Stage
from meshnet.reconcile.children import CONTAINER_SECURITY, POD_SECURITY, template_hash
from meshnet.reconcile.naming import endpoint, pod_name, service_name, stage_host
from meshnet.reconcile.route.identity import (
    ROUTE_KEY_MOUNT,
    ROUTE_KEY_PATH,
    STAGE,
    TLS_VOLUME,
    identity_env,
    route_key_volume,
    tls_volume,
)
from meshnet.reconcile.route.networkpolicy import PolicyConfig
from meshnet.reconcile.route.worker_command import worker_command
from meshnet.reconcile.route.workerspec import WorkerSpec

MODEL_DIR = "/models"
TLS_DIR = "/etc/meshnet/tls"


@dataclass(frozen=True)
class WorkerConfig:
    """Operator-wide inputs of every stage pod (from settings)."""

    images: Mapping[str, str] = field(default_factory=dict)  # lane -> image
    pin_digest: str = ""
    grpc_port: int = 50051
    metrics_port: int = 9090
    image_pull_policy: str = "IfNotPresent"
    startup_seconds: int = 1800  # large models take minutes to map and warm up
    gateway_image: str | None = None  # the operator's image (`meshnet serve`); None: no gateways
    gateway_port: int = 8000
    # A new epoch's pipeline of a replica starts beside the old one, which drains
    # (meshnet.reconcile.route.rollout). The local backend keeps old workers serving itself
    # (it hides them from the planner) and sets False: old epochs are deleted first.
    side_by_side: bool = True
    # The NetworkPolicy of each route's stage pods (meshnet.reconcile.route.networkpolicy).
    network_policy: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True)
class RouteRef:
    """The owning route: enough to name, label and own its children."""

    name: str
    namespace: str
    uid: str


def worker_args(worker: WorkerSpec, route: RouteRef, config: WorkerConfig) -> list[str]:
    """The `meshnet-shard-worker` command line of a stage pod: the model where the pod
    mounts it, its ports, its TLS Secret's files, and its links as the DNS names of the
    route's headless Service: this epoch's pod of that stage in this worker's replica (the
    name carries the epoch: a rollout runs two epochs of a replica side by side)."""
    links = {stage: endpoint(stage, route.name, route.namespace, config.grpc_port,
                             worker.replica, worker.epoch)
             for stage in worker.links.names()}
    return worker_command(worker, PurePosixPath(MODEL_DIR) / worker.model_file,
                          f"0.0.0.0:{config.grpc_port}", f"0.0.0.0:{config.metrics_port}",
                          links, PurePosixPath(TLS_DIR), ROUTE_KEY_PATH).args()


def owner_reference(route: RouteRef) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": route.name, "uid": route.uid,
            "controller": True, "blockOwnerDeletion": True}


def child_labels(route: RouteRef) -> dict[str, str]:
    return {"app.kubernetes.io/name": "meshnet-shard-worker",
            "app.kubernetes.io/instance": route.name,
            labels.MANAGED_BY: labels.OPERATOR_NAME, labels.ROUTE: route.name}


def _resources(stage: Stage, lane: str) -> dict[str, Any]:
    requests = {k: str(v) for k, v in stage.resources.requests.items()}
    limits = {k: str(v) for k, v in stage.resources.limits.items()}
    if stage.resources.gpus:
        gpu = stage.resources.gpu_resource_name or DEFAULT_GPU_RESOURCES[lane]
        requests[gpu] = limits[gpu] = str(stage.resources.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


# Pods of one stage in different replicas prefer different nodes, so that one node lost
# takes one replica's stage down, not every replica's.
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def _affinity(route: RouteRef, stage: Stage) -> dict[str, Any]:
    """The stage's affinity, plus a preferred anti-affinity to the stage's pods of the other
    replicas unless the stage sets podAntiAffinity itself (which then replaces it). The
    same for every replica and replica count, so scaling changes no running pod."""
    affinity = dict(stage.affinity or {})
    affinity.setdefault("podAntiAffinity", {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {labels.ROUTE: route.name,
                                              labels.STAGE: stage.name}},
            "topologyKey": HOSTNAME_TOPOLOGY}}]})
    return affinity


def _model_volume(storage: ArtifactStorage) -> dict[str, Any]:
    if storage.pvc is not None:
        claim = {"claimName": storage.pvc.claim_name, "readOnly": True}
        return {"name": "model", "persistentVolumeClaim": claim}
    assert storage.host_path is not None  # the CRD requires exactly one
    return {"name": "model", "hostPath": {"path": storage.host_path.path, "type": "Directory"}}


def _node_selector(stage: Stage, storage: ArtifactStorage, digest: str) -> dict[str, str]:
    selector = dict(stage.node_selector)
    if storage.host_path is not None:  # only nodes holding a verified copy
        selector[labels.artifact_node_label(digest)] = labels.VERIFIED
    return selector


# The worker's gRPC health: SERVING once it listens, a ring's first stage only once it has
# subscribed at the last stage (or after --ring-ready-ms); `meshnet up` waits for the same
# moment through the worker's `serving` line (meshnet.local.process.SERVING).
def _grpc_probe(port: int, period: int, failures: int) -> dict[str, Any]:
    return {"grpc": {"port": port}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}


# A stage served over TLS is probed on its metrics port's /health instead (the same
# state as its gRPC health): the kubelet's gRPC probe speaks no TLS.
def _http_probe(port: int, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def _container(stage: Stage, recipe: Recipe, args: list[str], config: WorkerConfig,
               mounts: list[dict[str, Any]], tls: bool = False) -> dict[str, Any]:
    probe, port = (_http_probe, config.metrics_port) if tls else (_grpc_probe, config.grpc_port)
    return {
        "name": "worker",
        "image": recipe.image or config.images[recipe.lane],
        "imagePullPolicy": config.image_pull_policy,
        "args": args,
        "ports": [{"name": "grpc", "containerPort": config.grpc_port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": config.metrics_port, "protocol": "TCP"}],
        "resources": _resources(stage, recipe.lane),
        "startupProbe": probe(port, 10, max(1, config.startup_seconds // 10)),
        "readinessProbe": probe(port, 5, 3),
        "livenessProbe": probe(port, 10, 6),
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": mounts,
    }


@dataclass(frozen=True)
class StageInputs:
    """What one stage pod is built from."""

    route: RouteRef
    stage: Stage
    recipe: Recipe
    storage: ArtifactStorage
    worker: WorkerSpec


def stage_pod(inputs: StageInputs, config: WorkerConfig) -> dict[str, Any]:
    """The pod serving one stage at one epoch."""
    route, stage, worker = inputs.route, inputs.stage, inputs.worker
    args = worker_args(worker, route, config)
    mounts: list[dict[str, Any]] = [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [_model_volume(inputs.storage), {"name": "tmp", "emptyDir": {}}]
    if inputs.storage.pvc is not None and inputs.storage.pvc.sub_path:
        mounts[0]["subPath"] = inputs.storage.pvc.sub_path
    if worker.tls is not None:
        mounts.append({"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True})
        volumes.append(tls_volume(worker.tls, STAGE))
    if worker.route_key_secret is not None:
        mounts.append(dict(ROUTE_KEY_MOUNT))
        volumes.append(route_key_volume(worker.route_key_secret))
    container = _container(stage, inputs.recipe, args, config, mounts, worker.tls is not None)
    if env := identity_env(worker.tls):
        container["env"] = env
    spec: dict[str, Any] = {
        "hostname": stage_host(stage.name, worker.epoch),
        "subdomain": service_name(route.name, worker.replica),
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
        "nodeSelector": _node_selector(stage, inputs.storage,
                                       worker.identities.manifest_digest),
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in stage.tolerations],
        "affinity": _affinity(route, stage),
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod_name(route.name, stage.name, worker.epoch, worker.replica),
            "namespace": route.namespace,
            "labels": {**child_labels(route), labels.STAGE: stage.name,
                       labels.EPOCH: str(worker.epoch), labels.REPLICA: str(worker.replica),
                       labels.DIGEST: worker.identities.route_digest[:16],
                       labels.TEMPLATE: template_hash(spec)},
            "annotations": {labels.ROUTE_DIGEST_ANNOTATION: worker.identities.route_digest},
            "ownerReferences": [owner_reference(route)],
        },
        "spec": spec,
    }


def headless_service(route: RouteRef, config: WorkerConfig, replica: int = 0) -> dict[str, Any]:
    """One headless Service per replica: DNS names for its stage pods of every epoch
    running (each pod's hostname carries its epoch)."""
    replica_label = {labels.REPLICA: str(replica)}
    spec = {
        "clusterIP": "None",
        "publishNotReadyAddresses": False,
        "selector": {labels.ROUTE: route.name, **replica_label},
        "ports": [{"name": "grpc", "port": config.grpc_port, "targetPort": "grpc"},
                  {"name": "metrics", "port": config.metrics_port, "targetPort": "metrics"}],
    }
    return owned_service(route, service_name(route.name, replica),
                         {**child_labels(route), **replica_label}, spec)


def owned_service(route: RouteRef, name: str, child: Mapping[str, str],
                  spec: dict[str, Any]) -> dict[str, Any]:
    """A Service the route owns, labelled with `child` and its spec's template hash."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": route.namespace,
                     "labels": {**child, labels.TEMPLATE: template_hash(spec)},
                     "ownerReferences": [owner_reference(route)]},
        "spec": spec,
    }
